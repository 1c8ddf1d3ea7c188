#!/usr/bin/env bash
# `make bench-spdk`: what libsqdisc_spdk costs SPDK per WR, against a provider with the behaviour of SPDK's
# verbs provider (benches/spdk_bench.c), on the software HCA's null mode, in one run. Instructions are counted
# by callgrind: (run of N requests - run of 0) / (4 N WRs); "sim" is the part spent in the software HCA's ops
# (--toggle-collect), "excl. sim" the rest. Allocations per WR come from benches/alloc_count.so preloaded, in
# the steady state (a run of 2N requests minus a run of N).
# Prints a markdown table and, unless BENCH_NO_DOC=1, writes it into docs/spdk.md between the
# bench-spdk:begin/bench-spdk:end markers. With --guard it only checks (make check's bench-guard): no
# allocation per WR, sqdisc's provider within 3x the verbs provider's instructions per WR.
# usage: scripts/bench-spdk.sh STAGE_DIR LIBDIR_IN_STAGE [--guard]
# env:   BENCH_N (requests per counted run, default 5000)
set -euo pipefail
stage=$1 libdir=$2 guard=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$root/build/bench-spdk
bin=$out/bin
lib=$stage$libdir
N=${BENCH_N:-5000}
[ -n "$guard" ] && N=${BENCH_N:-1000}
BATCHES=(1 8)
QD=64
pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
mkdir -p "$bin"
read -r -a cflags <<< "$(pc --cflags sqdisc_spdk sqdisc)"
read -r -a libs <<< "$(pc --libs sqdisc_spdk sqdisc)"
cc=${CC:-cc}
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -O2 -g "${cflags[@]}" benches/spdk_bench.c -o "$bin/spdk_bench" \
    -rdynamic "${libs[@]}" -Wl,-rpath,"$lib"
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -O2 -fPIC -shared benches/alloc_count.c -o "$bin/alloc_count.so"

cg() { # [valgrind options --] ARGS: instructions callgrind counts for one run
    local vg=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do vg+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    local log
    log=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "${vg[@]}" "$bin/spdk_bench" "$@" 2>&1 >/dev/null) \
        || { echo "bench-spdk: spdk_bench $* failed under callgrind:" >&2; echo "$log" >&2; exit 1; }
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<< "$log"
}
per_wr() { awk -v f="$1" -v z="$2" -v n="$3" 'BEGIN { printf "%.1f", (f - z) / n }'; }
kv() { tr ' ' '\n' <<< "$2" | sed -n "s/^$1=//p"; }
SIM_ONLY=('--toggle-collect=sqdisc::sim::ops::*')

declare -A instr excl allocs cqes bells
for b in "${BATCHES[@]}"; do
    for p in verbs sqdisc; do
        k=$p/$b
        args=("$p" -b "$b" -q "$QD")
        full=$(cg -- "${args[@]}" -n "$N")
        zero=$(cg -- "${args[@]}" -n 0)
        sfull=$(cg "${SIM_ONLY[@]}" -- "${args[@]}" -n "$N")
        szero=$(cg "${SIM_ONLY[@]}" -- "${args[@]}" -n 0)
        instr[$k]=$(per_wr "$full" "$zero" $((4 * N)))
        excl[$k]=$(awk -v a="${instr[$k]}" -v s="$(per_wr "$sfull" "$szero" $((4 * N)))" 'BEGIN { printf "%.1f", a - s }')
        # Steady state: a run of 2N requests minus a run of N, so that one-time growth (queues reaching their
        # high-water mark in the first rounds) cancels out.
        line=$(LD_PRELOAD=$bin/alloc_count.so "$bin/spdk_bench" "${args[@]}" -n "$N")
        line2=$(LD_PRELOAD=$bin/alloc_count.so "$bin/spdk_bench" "${args[@]}" -n $((2 * N)))
        allocs[$k]=$(awk -v a="$(kv allocs "$line2")" -v z="$(kv allocs "$line")" -v n=$((4 * N)) \
            'BEGIN { printf "%.3f", (a - z) / n }')
        cqes[$k]=$(awk -v c="$(kv cqes "$line")" -v n=$((4 * N)) 'BEGIN { printf "%.3f", c / n }')
        bells[$k]=$(awk -v c="$(kv doorbells "$line")" -v n=$((4 * N)) 'BEGIN { printf "%.3f", c / n }')
    done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

if [ -n "$guard" ]; then
    failed=0
    for b in "${BATCHES[@]}"; do
        if awk -v a="${allocs[sqdisc/$b]}" 'BEGIN { exit !(a == 0) }'; then
            echo "PASS spdk provider batch $b: 0 allocations per WR"
        else echo "FAIL spdk provider batch $b: ${allocs[sqdisc/$b]} allocations per WR"; failed=1; fi
        if awk -v a="${instr[sqdisc/$b]}" -v v="${instr[verbs/$b]}" 'BEGIN { exit !(a <= 3 * v) }'; then
            echo "PASS spdk provider batch $b: ${instr[sqdisc/$b]} instructions per WR = $(ratio "${instr[sqdisc/$b]}" "${instr[verbs/$b]}") the verbs provider's (${instr[verbs/$b]}) <= 3x"
        else echo "FAIL spdk provider batch $b: ${instr[sqdisc/$b]} instructions per WR > 3x the verbs provider's (${instr[verbs/$b]})"; failed=1; fi
    done
    [ "$failed" -eq 0 ]
    exit
fi

table=$out/table.md
{
    echo "Measured $(date -u +%Y-%m-%d) at commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\` by \`make bench-spdk\`"
    echo "(benches/spdk_bench.c; $N requests of 3 unsignaled RDMA WRITEs + 1 signaled SEND, qd $QD, max_send_wr $((2 * QD));"
    echo "software HCA in null mode; callgrind, N-request run minus 0-request run, per WR)."
    echo
    echo "| requests per flush | instr/WR verbs provider | sqdisc provider | ratio | excl. sim: verbs | sqdisc | ratio | allocs/WR sqdisc | CQEs/WR verbs · sqdisc | doorbells/WR |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    for b in "${BATCHES[@]}"; do
        v=verbs/$b s=sqdisc/$b
        echo "| $b | ${instr[$v]} | ${instr[$s]} | $(ratio "${instr[$s]}" "${instr[$v]}") | ${excl[$v]} | ${excl[$s]} | $(ratio "${excl[$s]}" "${excl[$v]}") | ${allocs[$s]} | ${cqes[$v]} · ${cqes[$s]} | ${bells[$s]} |"
    done
} > "$table"
cat "$table"
if [ "${BENCH_NO_DOC:-}" != 1 ]; then
    awk -v t="$table" '
        /<!-- bench-spdk:begin -->/ { print; while ((getline l < t) > 0) print l; skip = 1; next }
        /<!-- bench-spdk:end -->/ { skip = 0 }
        !skip' docs/spdk.md > "$out/spdk.md" && mv "$out/spdk.md" docs/spdk.md
fi
