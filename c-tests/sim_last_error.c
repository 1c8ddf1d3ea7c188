/* The software HCA's C functions live in libsqdisc_sim, which carries its own copy of the library's C layer;
 * a failing sqd_sim_* call must still leave its message where the program reads it: libsqdisc's
 * sqd_last_error() on the calling thread (through sqd_device_set_error). Also sqd_device_set_error itself.
 * Prints "PASS <name>" per check; exits non-zero on the first failure. */

#include <sqdisc.h>
#include <sqdisc_sim.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_message(int rc, int expected_rc, const char *expected, const char *name)
{
    const char *got = sqd_last_error();
    if (rc != expected_rc || strcmp(got, expected) != 0) {
        fprintf(stderr, "FAIL %s: rc %d (expected %d), sqd_last_error() \"%s\" (expected \"%s\")\n", name, rc,
                expected_rc, got, expected);
        exit(1);
    }
    printf("PASS %s\n", name);
}

int main(void)
{
    struct sqd_sim_config cfg;
    sqd_sim_config_default(&cfg);
    check_message(sqd_sim_new(&cfg, NULL), -EINVAL, "out is NULL", "sqd_sim_new(NULL out): message in sqd_last_error");

    struct sqd_sim *sim = NULL;
    if (sqd_sim_new(&cfg, &sim) != 0) {
        fprintf(stderr, "FAIL sqd_sim_new: %s\n", sqd_last_error());
        return 1;
    }
    /* A product failure, then a sim failure: each replaces the one message the thread has. */
    struct sqd_cq *cq = NULL;
    int rc = sqd_cq_new(NULL, &cq);
    char product[256];
    snprintf(product, sizeof product, "%s", sqd_last_error());
    if (rc >= 0 || product[0] == '\0') {
        fprintf(stderr, "FAIL sqd_cq_new(NULL): rc %d, message \"%s\"\n", rc, product);
        return 1;
    }
    static char buf[64];
    struct ibv_mr *mr = NULL;
    check_message(sqd_sim_reg_mr(sim, buf, sizeof buf, -1, &mr), -EINVAL, "access -1 is negative",
                  "sqd_sim_reg_mr(access -1) after a failing sqd_cq_new: the sim's message replaces it");
    check_message(sqd_cq_new(NULL, &cq), rc, product, "then a failing sqd_cq_new: its message again");

    check_message(sqd_device_set_error("device says no"), 0, "device says no", "sqd_device_set_error");
    check_message(sqd_device_set_error(NULL), -EINVAL, "message is NULL", "sqd_device_set_error(NULL)");

    if (sqd_sim_free(sim) != 0) {
        fprintf(stderr, "FAIL sqd_sim_free: %s\n", sqd_last_error());
        return 1;
    }
    return 0;
}
