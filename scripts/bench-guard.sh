#!/usr/bin/env bash
# `make bench-guard`: a cheap, untimed check that fails on a gross regression of sqdisc's data path only. Every
# figure is a count (callgrind instructions, allocations, CQEs, doorbells), never a time. Same workload as
# `make bench` (benches/sqd_bench.c, software HCA in null mode, sq_depth 128, signal interval 32):
#   1. no heap allocation per WR in steady state (sqdisc poster, 4 SGEs, batch 1, 24 and 32: 24 leaves an
#      unsignaled tail after most posts, so the idle-tail watch list is in use);
#   2. CQEs per WR <= 1/32 + 1/batch and exactly one doorbell per post call;
#   3. instructions per WR at batch 32: sqdisc <= 3x the hand-moderated raw verbs poster (both including the
#      software HCA's own post/poll, as in the bench table; today about 1.08x);
#   4. instructions per WR at batch 32 spent outside the software HCA (library + loop): <= 1000 (today about 92),
#      so that the check does not depend on how fast the software HCA is;
#   5. on the null provider (benches/null_provider.c, a few instructions per WR): sqdisc / hand-moderated raw
#      verbs at batch 1, 8 and 32 at most the limits below (today's ratios with a 3% margin), so that a
#      regression of the library's hot path fails here; and CQEs per
#      WR = 1/32 for sqdisc there. The same ratio check, and the CQE check, for the posters with the API's opt-in
#      options (batched releases; those and SQD_QUEUE_NO_RESTORE; batched releases and SQD_QUEUE_INDEXED), each
#      of which must also cost less than the poster without its option; the lean one must cost fewer
#      instructions than the signal-every-WR raw verbs poster at batch 32, and the indexed one at batch 8 and 32.
#      The sqdisc poster and the by-hand references (benches/contract_by_hand.c) release each WR once, in post
#      order, and restore the posted chain (sqd_bench -o 1); benches/contract_by_hand_check.c: the reference's
#      paths that the loop does not take (a bad WR, no free slot, an idle tail, an indexed queue).
#      First, benches/null_provider_check.c: the null provider itself behaves as
#      documented (a post without a free SQ slot fails, a CQE frees the slots up to its WQE), so that a
#      moderation bug would show on it.
# usage: scripts/bench-guard.sh STAGE_DIR LIBDIR_IN_STAGE      (make bench-guard stages a private install)
set -euo pipefail
source "$(dirname "$0")/bench-lib.sh"
bench_init "$1" "$2"

N=4800 # a multiple of every batch size below: no partial batch
RATIO_MAX=3.0
OWN_MAX=1000

# Check 5's limits: sqdisc / hand-moderated on the null provider, per batch size, held at what is reached. A
# ratio that meets its target (NULL_TARGET, INDEXED_TARGET in bench-lib.sh) would be held at the target itself;
# none of the default API's does. The others are held at the ratios measured on 2026-12-05 at 8cfa825 (the
# eleventh round: cg_per_wr 1600, as below) plus 3%: instruction counts are exact, so the margin only absorbs a
# compiler's different code for the C posters. Default API: 2.127, 2.339, 2.187.
# Tighten them as the hot path improves toward the targets in docs/PERFORMANCE.md.
declare -A NULL_RATIO_MAX=([1]=2.19 [8]=2.41 [32]=2.25)
# The same for the posters with the API's opt-in options: batched releases (sqd_queue_set_release_batch) 2.000,
# 2.002, 1.776; batched releases with SQD_QUEUE_NO_RESTORE 1.999, 1.794, 1.613. Each option must also make its
# poster cheaper than the one without it at every batch size, or the option has lost what it is for; and the
# lean poster must cost fewer instructions than signal-every-WR at batch 32, as it does since the sixth round.
declare -A BATCHED_RATIO_MAX=([1]=2.06 [8]=2.06 [32]=1.83)
declare -A LEAN_RATIO_MAX=([1]=2.06 [8]=1.85 [32]=1.66)
# Batched releases on a queue with SQD_QUEUE_INDEXED: 1.973, 1.682, 1.482, below signal-every-WR at batch 8 and
# 32. Batch 1 meets its target and is held at it (2.0); batch 32 stays held at 1.50, the target it met before
# the targets were lowered to 1.35.
declare -A INDEXED_RATIO_MAX=([1]=2.00 [8]=1.73 [32]=1.50)
# The default API and the indexed poster against the lean hand-moderated poster (raw-lean: no helper calls, the
# ring index as wr_id), so that a baseline made costlier cannot flatter the ratios above: 2.112, 2.374, 2.231
# and 1.959, 1.707, 1.512 at 8cfa825, plus 3%.
declare -A RAW_LEAN_RATIO_MAX=([1]=2.18 [8]=2.45 [32]=2.30)
declare -A RAW_LEAN_INDEXED_RATIO_MAX=([1]=2.02 [8]=1.76 [32]=1.56)
NULL_N=1600 # counted WRs per run: (I(2N) - I(N)) / N, a multiple of 32
failed=0
check() { # description ok(0/1)
    if [ "$2" = 1 ]; then echo "PASS $1"; else echo "FAIL $1"; failed=1; fi
}
le() { awk -v a="$1" -v b="$2" 'BEGIN { print (a <= b + 1e-9 ? 1 : 0) }'; }

for b in 1 24 32; do
    line=$(LD_PRELOAD=$bin/alloc_count.so "$bin/sqd_bench" sqdisc -b "$b" -s 4 -n "$N")
    a=$(kv allocs "$line")
    if [ -z "$a" ]; then
        echo "FAIL the allocation counter was not loaded: $line"
        exit 1
    fi
    check "batch $b: $a heap allocations in $N steady-state WRs (must be 0)" "$([ "$a" = 0 ] && echo 1 || echo 0)"
    c=$(kv cqes_per_wr "$line")
    lim=$(awk -v b="$b" 'BEGIN { printf "%.5f", 1 / 32 + 1 / b }')
    check "batch $b: $c CQEs per WR <= $lim" "$(le "$c" "$lim")"
    d=$(kv doorbells_per_wr "$line")
    check "batch $b: $d doorbells per WR = 1/$b" "$(awk -v d="$d" -v b="$b" 'BEGIN { print (d - 1 / b < 1e-4 && 1 / b - d < 1e-4 ? 1 : 0) }')"
done

args=(-b 32 -s 1 -d 128)
q=$(per_wr "$(cg_total -- sqdisc "${args[@]}" -n "$N")" "$(cg_total -- sqdisc "${args[@]}" -n 0)" "$N")
m=$(per_wr "$(cg_total -- raw-moderated "${args[@]}" -n "$N")" "$(cg_total -- raw-moderated "${args[@]}" -n 0)" "$N")
s=$(per_wr "$(cg_total "${SIM_ONLY[@]}" -- sqdisc "${args[@]}" -n "$N")" "$(cg_total "${SIM_ONLY[@]}" -- sqdisc "${args[@]}" -n 0)" "$N")
r=$(awk -v q="$q" -v m="$m" 'BEGIN { printf "%.2f", q / m }')
own=$(awk -v q="$q" -v s="$s" 'BEGIN { printf "%.1f", q - s }')
check "batch 32: sqdisc $q instructions per WR = ${r}x hand-moderated ($m) <= ${RATIO_MAX}x" "$(le "$r" "$RATIO_MAX")"
check "batch 32: sqdisc spends $own instructions per WR outside the software HCA <= $OWN_MAX" "$(le "$own" "$OWN_MAX")"

ok=1
msg=$("$bin/null_provider_check" 2>&1) || ok=0
check "the null provider refuses a post without a free SQ slot and frees slots by CQE ($msg)" "$ok"
ok=1
msg=$("$bin/contract_by_hand_check" 2>&1) || ok=0
check "the by-hand reference refuses bad WRs and posts without a slot, covers an idle tail, releases in order ($msg)" "$ok"
for b in 1 8 32; do
    args=(-P null -b "$b" -s 1 -d 128)
    q=$(cg_per_wr "$NULL_N" -- sqdisc "${args[@]}")
    m=$(cg_per_wr "$NULL_N" -- raw-moderated "${args[@]}")
    r=$(awk -v q="$q" -v m="$m" 'BEGIN { printf "%.3f", q / m }')
    check "null provider, batch $b: sqdisc $q instructions per WR = ${r}x hand-moderated ($m) <= ${NULL_RATIO_MAX[$b]}x (target ${NULL_TARGET[$b]}x)" \
        "$(le "$r" "${NULL_RATIO_MAX[$b]}")"
    qb=$(cg_per_wr "$NULL_N" -- sqdisc-batch "${args[@]}")
    rb=$(awk -v q="$qb" -v m="$m" 'BEGIN { printf "%.3f", q / m }')
    check "null provider, batch $b: sqdisc with batched releases $qb instructions per WR = ${rb}x hand-moderated <= ${BATCHED_RATIO_MAX[$b]}x, and < $q (per-WR releases)" \
        "$(awk -v ok="$(le "$rb" "${BATCHED_RATIO_MAX[$b]}")" -v qb="$qb" -v q="$q" 'BEGIN { print (ok == 1 && qb < q ? 1 : 0) }')"
    ql=$(cg_per_wr "$NULL_N" -- sqdisc-lean "${args[@]}")
    rl=$(awk -v q="$ql" -v m="$m" 'BEGIN { printf "%.3f", q / m }')
    check "null provider, batch $b: sqdisc with batched releases and NO_RESTORE $ql instructions per WR = ${rl}x hand-moderated <= ${LEAN_RATIO_MAX[$b]}x, and < $qb (without NO_RESTORE)" \
        "$(awk -v ok="$(le "$rl" "${LEAN_RATIO_MAX[$b]}")" -v ql="$ql" -v qb="$qb" 'BEGIN { print (ok == 1 && ql < qb ? 1 : 0) }')"
    qi=$(cg_per_wr "$NULL_N" -- sqdisc-indexed "${args[@]}")
    ri=$(awk -v q="$qi" -v m="$m" 'BEGIN { printf "%.3f", q / m }')
    check "null provider, batch $b: sqdisc with batched releases and INDEXED $qi instructions per WR = ${ri}x hand-moderated <= ${INDEXED_RATIO_MAX[$b]}x, and < $ql (NO_RESTORE)" \
        "$(awk -v ok="$(le "$ri" "${INDEXED_RATIO_MAX[$b]}")" -v qi="$qi" -v ql="$ql" 'BEGIN { print (ok == 1 && qi < ql ? 1 : 0) }')"
    ml=$(cg_per_wr "$NULL_N" -- raw-lean "${args[@]}")
    rq=$(awk -v q="$q" -v m="$ml" 'BEGIN { printf "%.3f", q / m }')
    check "null provider, batch $b: sqdisc $q instructions per WR = ${rq}x lean hand-moderated ($ml) <= ${RAW_LEAN_RATIO_MAX[$b]}x" \
        "$(le "$rq" "${RAW_LEAN_RATIO_MAX[$b]}")"
    rqi=$(awk -v q="$qi" -v m="$ml" 'BEGIN { printf "%.3f", q / m }')
    check "null provider, batch $b: sqdisc with batched releases and INDEXED $qi instructions per WR = ${rqi}x lean hand-moderated <= ${RAW_LEAN_INDEXED_RATIO_MAX[$b]}x" \
        "$(le "$rqi" "${RAW_LEAN_INDEXED_RATIO_MAX[$b]}")"
    if [ "$b" != 1 ]; then
        qs=$(cg_per_wr "$NULL_N" -- raw-signal "${args[@]}")
        check "null provider, batch $b: sqdisc with batched releases and INDEXED $qi instructions per WR < signal-every-WR raw verbs $qs" \
            "$(awk -v qi="$qi" -v qs="$qs" 'BEGIN { print (qi < qs ? 1 : 0) }')"
    fi
done
args=(-P null -b 32 -s 1 -d 128)
ql=$(cg_per_wr "$NULL_N" -- sqdisc-lean "${args[@]}")
qs=$(cg_per_wr "$NULL_N" -- raw-signal "${args[@]}")
check "null provider, batch 32: sqdisc with batched releases and NO_RESTORE $ql instructions per WR < signal-every-WR raw verbs $qs" \
    "$(awk -v ql="$ql" -v qs="$qs" 'BEGIN { print (ql < qs ? 1 : 0) }')"
# The per-WR release posters, sqdisc's and the reference that keeps its contract by hand
# (benches/contract_by_hand.c, a row of the bench's report): each WR released once, in post order, and the chain
# restored after each post (-o 1), at batch 1, 8 and 24 (an unsignaled tail after most posts); the indexed
# reference's batches each start at the index the callback expects.
for p in sqdisc by-hand by-hand-indexed; do
    for b in 1 8 24; do
        ok=1
        "$bin/sqd_bench" "$p" -P null -b "$b" -s 1 -n "$N" -o 1 > /dev/null || ok=0
        what="releases each WR once, in post order, and restores the posted chain"
        [ "$p" = by-hand-indexed ] && what="releases each WR once, in post order (batches by index)"
        check "null provider, batch $b: $p $what" "$ok"
    done
done
for p in sqdisc sqdisc-lean sqdisc-indexed; do
    line=$("$bin/sqd_bench" "$p" -P null -b 8 -s 1 -n "$N")
    c=$(kv cqes_per_wr "$line")
    check "null provider, batch 8: $p $c CQEs per WR = 1/32" "$(awk -v c="$c" 'BEGIN { print (c - 1 / 32 < 1e-4 && 1 / 32 - c < 1e-4 ? 1 : 0) }')"
done

if [ "$failed" != 0 ]; then
    echo "bench-guard: FAILED (see docs/PERFORMANCE.md for the figures and how to profile)"
    exit 1
fi
echo "bench-guard: all checks passed"
