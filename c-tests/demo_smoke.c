/* The demo (examples/demo.c) as a test: the same code, with fewer requests, run on a few seeds and depths.
 * The sqdisc run must be clean on every one; the raw run must fail in the ways the demo explains (a data
 * corruption or a QP failure, ENOMEM, violations logged by the sim); the command line is checked too.
 * Prints "PASS demo_smoke" and exits 0, or "FAIL ..." and exits 1. */
#define main demo_main
#include "../examples/demo.c"
#undef main

static int failures;

static void expect(bool cond, const char *what, const struct opts *o)
{
    if (!cond) {
        printf("FAIL demo_smoke: %s (seed %llu, depth %u, %llu requests)\n", what, (unsigned long long)o->seed,
               o->depth, (unsigned long long)o->requests);
        failures++;
    }
}

static int parse(int argc, const char *const *args, struct opts *o)
{
    char *argv[8];
    for (int i = 0; i < argc; i++)
        argv[i] = (char *)args[i];
    return parse_args(argc, argv, o);
}

int main(void)
{
    static struct run raw, managed;
    struct opts base = {.seed = 1, .loss_ppm = DEFAULT_LOSS, .ack_loss_ppm = DEFAULT_ACK_LOSS,
                        .requests = 3000, .depth = DEFAULT_DEPTH};

    /* The defaults, shortened: the raw run fails in several ways, the sqdisc run is clean. */
    run_workload(&raw, false, &base);
    run_workload(&managed, true, &base);
    expect(clean(&base, &managed.r), "the sqdisc run is not clean", &base);
    expect(raw.r.ok < base.requests, "every raw request completed correctly", &base);
    expect(raw.r.corrupted + raw.r.bogus > 0, "no raw data corruption", &base);
    expect(qp_failures(&raw.r) > 0, "no raw QP failure", &base);
    expect(raw.r.enomem > 0, "no raw ENOMEM", &base);
    expect(raw.r.violations[SQD_SIM_VIOLATION_SOURCE_MODIFIED] > 0, "no 'source modified' violation", &base);
    expect(raw.r.violations[SQD_SIM_VIOLATION_SQ_OVERFLOW] == raw.r.enomem, "ENOMEMs and SQ overflows differ",
           &base);
    expect(raw.r.inv_unsafe > 0, "no LocalInv found the MR in use (violation text changed?)", &base);
    expect(managed.r.inv_requested == base.requests, "sqdisc did not invalidate every rkey", &base);

    /* The sqdisc run stays clean across seeds, depths and loss rates. */
    static const uint32_t depths[] = {1, 3, 16, 64};
    for (uint64_t seed = 2; seed < 6; seed++)
        for (unsigned d = 0; d < sizeof depths / sizeof depths[0]; d++) {
            struct opts o = base;
            o.seed = seed;
            o.depth = depths[d];
            o.requests = 500;
            o.loss_ppm = o.ack_loss_ppm = (uint32_t)(seed * 10000);
            run_workload(&managed, true, &o);
            expect(clean(&o, &managed.r), "the sqdisc run is not clean", &o);
        }

    /* The command line. */
    struct opts o = base;
    expect(parse(5, (const char *const[]){"demo", "--seed", "7", "--depth=3", "--loss=0"}, &o) == 0 && o.seed == 7 &&
               o.depth == 3 && o.loss_ppm == 0,
           "flags not parsed", &o);
    expect(parse(2, (const char *const[]){"demo", "--bogus"}, &o) != 0, "an unknown flag was accepted", &o);
    expect(parse(3, (const char *const[]){"demo", "--depth", "0"}, &o) != 0, "--depth 0 was accepted", &o);
    expect(parse(3, (const char *const[]){"demo", "--loss", "1000001"}, &o) != 0, "--loss above 1e6 accepted", &o);
    expect(parse(2, (const char *const[]){"demo", "--seed"}, &o) != 0, "--seed without a value accepted", &o);
    expect(parse(3, (const char *const[]){"demo", "--requests", "-1"}, &o) != 0, "--requests -1 accepted", &o);

    if (failures)
        return 1;
    printf("PASS demo_smoke\n");
    return 0;
}
