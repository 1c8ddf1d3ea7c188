/* Test adapter: tells libsqdisc_check about the software HCA's objects.
 *
 * The sim makes its QPs, CQs and MRs with sqd_sim_* functions, not with libibverbs' ibv_create_qp etc., so the
 * checker's interposed constructors never see them. Preloaded after libsqdisc_check.so
 * (LD_PRELOAD="libsqdisc_check.so sim_shim.so"), this library interposes the sim's constructors and
 * destructors and makes the same sqd_check_* calls the checker makes for libibverbs' own. The program under
 * test is not changed.
 *
 * With SQDISC_CHECK_COMPARE=1 it also compares, when each sim is freed, the sim's violation log with the
 * checker's findings since the previous sim (docs/check.md, "What CI proves"), prints one line per sim:
 *   compare sim N: sim V violations (by kind ...), checker C violations (by kind ...), unmatched U
 * and one "UNMATCHED ..." line per sim violation the checker did not report, then forgets the findings. */
#define _GNU_SOURCE
#include <sqdisc_sim.h>
#include <sqdisc_check.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int sqd_sim_new(const struct sqd_sim_config *cfg, struct sqd_sim **out)
{
    int rc = NEXT(sqd_sim_new)(cfg, out);
    if (rc == 0)
        sqd_check_attach(sqd_sim_context(*out));
    return rc;
}

int sqd_sim_reg_mr(const struct sqd_sim *sim, void *addr, size_t len, int access, struct ibv_mr **out)
{
    int rc = NEXT(sqd_sim_reg_mr)(sim, addr, len, access, out);
    if (rc == 0)
        sqd_check_track_mr(*out);
    return rc;
}

int sqd_sim_dereg_mr(struct ibv_mr *mr)
{
    sqd_check_untrack_mr(mr);
    return NEXT(sqd_sim_dereg_mr)(mr);
}

int sqd_sim_create_cq(const struct sqd_sim *sim, int cqe, struct ibv_cq **out)
{
    int rc = NEXT(sqd_sim_create_cq)(sim, cqe, out);
    if (rc == 0)
        sqd_check_track_cq(*out);
    return rc;
}

int sqd_sim_create_cq_ex(const struct sqd_sim *sim, int cqe, struct ibv_comp_channel *channel, void *cq_context,
                         int comp_vector, struct ibv_cq **out)
{
    int rc = NEXT(sqd_sim_create_cq_ex)(sim, cqe, channel, cq_context, comp_vector, out);
    if (rc == 0)
        sqd_check_track_cq(*out);
    return rc;
}

int sqd_sim_resize_cq(struct ibv_cq *cq, int cqe)
{
    int rc = NEXT(sqd_sim_resize_cq)(cq, cqe);
    if (rc == 0)
        sqd_check_resize_cq(cq, cqe);
    return rc;
}

int sqd_sim_destroy_cq(struct ibv_cq *cq)
{
    int rc = NEXT(sqd_sim_destroy_cq)(cq);
    if (rc == 0)
        sqd_check_untrack_cq(cq);
    return rc;
}

int sqd_sim_create_qp(const struct sqd_sim *sim, struct ibv_qp_init_attr *attr, struct ibv_qp **out)
{
    int rc = NEXT(sqd_sim_create_qp)(sim, attr, out);
    if (rc == 0)
        sqd_check_track_qp(*out, attr);
    return rc;
}

int sqd_sim_set_error(struct ibv_qp *qp)
{
    int rc = NEXT(sqd_sim_set_error)(qp);
    if (rc == 0)
        sqd_check_qp_state(qp, IBV_QPS_ERR);
    return rc;
}

int sqd_sim_destroy_qp(struct ibv_qp *qp)
{
    sqd_check_untrack_qp(qp);
    return NEXT(sqd_sim_destroy_qp)(qp);
}

/* The checker kind that reports the rule behind a sim violation kind (0: no checker rule). */
static uint32_t checker_kind(const struct sqd_sim_violation *v)
{
    switch (v->kind) {
    case SQD_SIM_VIOLATION_SQ_OVERFLOW: return SQD_CHECK_SQ_OVERFLOW;
    case SQD_SIM_VIOLATION_CQ_OVERRUN: return SQD_CHECK_CQ_UNDERSIZED;
    case SQD_SIM_VIOLATION_SOURCE_MODIFIED: return SQD_CHECK_SOURCE_MODIFIED;
    case SQD_SIM_VIOLATION_MR_IN_USE: return strstr(v->text, "LOCAL_INV") ? SQD_CHECK_UNFENCED_INV : SQD_CHECK_MR_IN_USE;
    default: return 0;
    }
}

/* Whether a kept checker finding of `kind` reports the sim's violation `v`: the same QP, and for the WQE
 * rules the same WQE (SQ overflow, source modified) or one at or before it (an MR in use: the checker names the
 * first WQE no CQE covers, the sim the first the HCA is not finished with; those are the same WQE or the
 * checker's is earlier). An undersized CQ is reported at the creation of the QP whose CQE the sim lost. */
static int reported(uint32_t kind, const struct sqd_sim_violation *v, unsigned char *used, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct sqd_check_record r;
        if (sqd_check_record(kind, i, &r) || r.qp_num != v->qp_num)
            continue;
        switch (kind) {
        case SQD_CHECK_CQ_UNDERSIZED:
            return 1;
        case SQD_CHECK_SQ_OVERFLOW:
        case SQD_CHECK_SOURCE_MODIFIED:
            if (r.wqe_index == v->wqe_index)
                return 1;
            break;
        default:
            if (!used[i] && r.wqe_index <= v->wqe_index) {
                used[i] = 1;
                return 1;
            }
        }
    }
    return 0;
}

static unsigned sims;

int sqd_sim_free(struct sqd_sim *sim)
{
    const char *cmp = getenv("SQDISC_CHECK_COMPARE");
    if (sim && cmp && *cmp == '1') {
        uint64_t sim_by_kind[8] = {0}, unmatched = 0;
        int nv = sqd_sim_violation_count(sim);
        size_t kept[SQD_CHECK_KINDS + 1] = {0};
        unsigned char *used[SQD_CHECK_KINDS + 1] = {0};
        for (uint32_t k = 1; k <= SQD_CHECK_KINDS; k++) {
            kept[k] = sqd_check_count(k);
            used[k] = calloc(kept[k] + 1, 1);
        }
        for (int i = 0; i < nv; i++) {
            struct sqd_sim_violation v;
            if (sqd_sim_violation(sim, (size_t)i, &v))
                continue;
            sim_by_kind[v.kind < 8 ? v.kind : 0]++;
            uint32_t k = checker_kind(&v);
            if (k && !reported(k, &v, used[k], kept[k])) {
                unmatched++;
                if (unmatched <= 20)
                    printf("UNMATCHED sim %u: %s\n", sims, v.text);
            }
        }
        printf("compare sim %u: sim %d violations (SQ overflow %llu, CQ overrun %llu, source modified %llu, MR in "
               "use %llu), checker %llu violations (",
               sims, nv, (unsigned long long)sim_by_kind[SQD_SIM_VIOLATION_SQ_OVERFLOW],
               (unsigned long long)sim_by_kind[SQD_SIM_VIOLATION_CQ_OVERRUN],
               (unsigned long long)sim_by_kind[SQD_SIM_VIOLATION_SOURCE_MODIFIED],
               (unsigned long long)sim_by_kind[SQD_SIM_VIOLATION_MR_IN_USE], (unsigned long long)sqd_check_count(0));
        for (uint32_t k = 1; k <= SQD_CHECK_KINDS; k++)
            printf("%s%s %llu", k > 1 ? ", " : "", sqd_check_kind_str(k), (unsigned long long)sqd_check_count(k));
        printf("), unmatched %llu\n", (unsigned long long)unmatched);
        fflush(stdout);
        for (uint32_t k = 1; k <= SQD_CHECK_KINDS; k++)
            free(used[k]);
        sqd_check_reset();
        sims++;
    }
    if (sim)
        sqd_check_detach(sqd_sim_context(sim));
    return NEXT(sqd_sim_free)(sim);
}
