#!/usr/bin/env bash
# `make bench-guard`: a cheap, untimed check that fails on a gross regression of sqdisc's data path only. Every
# figure is a count (callgrind instructions, allocations, CQEs, doorbells), never a time. Same workload as
# `make bench` (benches/sqd_bench.c, software HCA in null mode, sq_depth 128, signal interval 32):
#   1. no heap allocation per WR in steady state (sqdisc poster, 4 SGEs, batch 1, 24 and 32: 24 leaves an
#      unsignaled tail after most posts, so the idle-tail watch list is in use);
#   2. CQEs per WR <= 1/32 + 1/batch and exactly one doorbell per post call;
#   3. instructions per WR at batch 32: sqdisc <= 3x the hand-moderated raw verbs poster (both including the
#      software HCA's own post/poll, as in the bench table; today about 1.23x);
#   4. instructions per WR at batch 32 spent outside the software HCA (library + loop): <= 1000 (today about 216),
#      so that the check does not depend on how fast the software HCA is.
# usage: scripts/bench-guard.sh STAGE_DIR LIBDIR_IN_STAGE      (make bench-guard stages a private install)
set -euo pipefail
source "$(dirname "$0")/bench-lib.sh"
bench_init "$1" "$2"

N=4800 # a multiple of every batch size below: no partial batch
RATIO_MAX=3.0
OWN_MAX=1000
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

if [ "$failed" != 0 ]; then
    echo "bench-guard: FAILED (see docs/PERFORMANCE.md for the figures and how to profile)"
    exit 1
fi
echo "bench-guard: all checks passed"
