#!/usr/bin/env bash
# `make bench-spdk`: what libsqdisc_spdk costs SPDK per WR, against a provider with the behaviour of SPDK's
# verbs provider (benches/spdk_bench.c), on the null provider of the benchmarks (benches/null_provider.c, a few
# instructions per WR), in one run. Instructions are counted by callgrind: (run of N requests - run of 0) /
# (4 N WRs); "device" is the part spent in the null provider's ops (--toggle-collect), "excl. device" the rest. Allocations per WR come from benches/alloc_count.so preloaded, in
# the steady state (a run of 2N requests minus a run of N).
# Prints a markdown table and, unless BENCH_NO_DOC=1, writes it into docs/spdk.md between the
# bench-spdk:begin/bench-spdk:end markers; and the instructions per ibv_poll_cq of an empty CQ
# (benches/spdk_poll_bench.c: the device's op alone, a CQ with no managed QP on a patched context, a managed CQ)
# between the bench-spdk-poll markers. With --guard it only checks (make check's bench-guard): no allocation per
# WR, sqdisc's provider within RATIO_MAX of the verbs provider's instructions per WR, and the instructions added
# to the empty poll of a CQ with no managed QP and of a managed CQ within the limits below.
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
# The rows: the target's loop at each batch size, the host's (one capsule SEND and one response receive per
# request, 1 request per flush: benches/spdk_bench.c -m host), and the target's on a shared receive queue, as SPDK
# runs it by default (the capsule's receive, reposted to the SRQ, then the three WRITEs and the SEND: -m srq).
ROWS=(1 8 h1 s1)
row_args() { case $1 in h1) echo "-m host -b 1" ;; s1) echo "-m srq -b 1" ;; *) echo "-b $1" ;; esac; }
row_wrs() { case $1 in h1) echo 2 ;; s1) echo 5 ;; *) echo 4 ;; esac; }
row_label() { case $1 in h1) echo "host: SEND + RECV, 1" ;; s1) echo "target on an SRQ: RECV + 3 WRITEs + SEND, 1" ;; *) echo "target: $1" ;; esac; }
QD=64
pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
mkdir -p "$bin"
read -r -a cflags <<< "$(pc --cflags sqdisc_spdk sqdisc)"
read -r -a libs <<< "$(pc --libs sqdisc_spdk)"
cc=${CC:-cc}
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -O2 -g "${cflags[@]}" benches/spdk_bench.c benches/null_provider.c \
    benches/contract_by_hand.c -o "$bin/spdk_bench" \
    -rdynamic -Wl,--no-as-needed "${libs[@]}" -Wl,-rpath,"$lib"
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -O2 -g "${cflags[@]}" benches/spdk_poll_bench.c benches/null_provider.c \
    -o "$bin/spdk_poll_bench" -rdynamic -Wl,--no-as-needed "${libs[@]}" -Wl,-rpath,"$lib"
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
cg_poll() { # MODE POLLS: instructions callgrind counts for one run of spdk_poll_bench
    local log
    log=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin/spdk_poll_bench" "$1" -n "$2" 2>&1 >/dev/null) \
        || { echo "bench-spdk: spdk_poll_bench $1 -n $2 failed under callgrind:" >&2; echo "$log" >&2; exit 1; }
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<< "$log"
}
per_wr() { awk -v f="$1" -v z="$2" -v n="$3" 'BEGIN { printf "%.1f", (f - z) / n }'; }
kv() { tr ' ' '\n' <<< "$2" | sed -n "s/^$1=//p"; }
# The device's ops of each row's loop. Only one set per row: null_post_send_echo calls null_post_send, and
# callgrind's toggles of nested functions cancel (the inner call would be counted as outside the device).
row_device() {
    case $1 in
        h1) echo "--toggle-collect=null_post_send_echo --toggle-collect=null_post_recv_echo --toggle-collect=null_poll_cq_echo" ;;
        s1) echo "--toggle-collect=null_post_send_echo_srq --toggle-collect=null_post_srq_recv --toggle-collect=null_poll_cq_echo_srq" ;;
        *) echo "--toggle-collect=null_post_send --toggle-collect=null_post_recv --toggle-collect=null_poll_cq" ;;
    esac
}

declare -A instr excl allocs cqes bells
for b in "${ROWS[@]}"; do
    w=$(row_wrs "$b")
    read -r -a rargs <<< "$(row_args "$b")"
    read -r -a device_only <<< "$(row_device "$b")"
    providers=(verbs sqdisc)
    # The target's loop also with sqdisc's promises kept by hand in SPDK's own code (a reference, not guarded).
    case $b in h1 | s1) ;; *) [ -n "$guard" ] || providers+=(by-hand) ;; esac
    for p in "${providers[@]}"; do
        k=$p/$b
        args=("$p" "${rargs[@]}" -q "$QD")
        full=$(cg -- "${args[@]}" -n "$N")
        zero=$(cg -- "${args[@]}" -n 0)
        sfull=$(cg "${device_only[@]}" -- "${args[@]}" -n "$N")
        szero=$(cg "${device_only[@]}" -- "${args[@]}" -n 0)
        instr[$k]=$(per_wr "$full" "$zero" $((w * N)))
        excl[$k]=$(awk -v a="${instr[$k]}" -v s="$(per_wr "$sfull" "$szero" $((w * N)))" 'BEGIN { printf "%.1f", a - s }')
        # Steady state: a run of 2N requests minus a run of N, so that one-time growth (queues reaching their
        # high-water mark in the first rounds) cancels out.
        line=$(LD_PRELOAD=$bin/alloc_count.so "$bin/spdk_bench" "${args[@]}" -n "$N")
        line2=$(LD_PRELOAD=$bin/alloc_count.so "$bin/spdk_bench" "${args[@]}" -n $((2 * N)))
        allocs[$k]=$(awk -v a="$(kv allocs "$line2")" -v z="$(kv allocs "$line")" -v n=$((w * N)) \
            'BEGIN { printf "%.3f", (a - z) / n }')
        cqes[$k]=$(awk -v c="$(kv cqes "$line")" -v n=$((w * N)) 'BEGIN { printf "%.3f", c / n }')
        bells[$k]=$(awk -v c="$(kv doorbells "$line")" -v n=$((w * N)) 'BEGIN { printf "%.3f", c / n }')
    done
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

# Instructions per ibv_poll_cq of an empty CQ: the device's op alone, through the provider's lookup for a CQ
# with no managed QP, and through sqdisc for a managed one.
POLLS=${BENCH_POLLS:-20000}
[ -n "$guard" ] && POLLS=${BENCH_POLLS:-5000}
declare -A poll
for m in unpatched passthrough managed; do
    poll[$m]=$(per_wr "$(cg_poll "$m" "$POLLS")" "$(cg_poll "$m" 0)" "$POLLS")
done
# The guard's limits (make bench-guard), on the null provider. Per WR: sqdisc's provider / the verbs provider's
# behaviour, per requests per flush (issue targets: 1.5 at 1, 1.3 at 8). Empty polls: instructions added to the
# device's op for a CQ with no managed QP on a patched context (target 5) and for a managed CQ (target 15).
# Each limit that meets its target is held at the target; the others at the figure reached, plus a margin
# (3% for the loops, whose counts only a change of the code moves).
# Reached (2026-12-05: successes released without a call, receives released in a loop of their own, an SRQ's
# without its due queue, single receives posted without the chain's walks): 3.57x, 2.88x (target loop), 3.88x
# (host loop), 3.22x (target loop on an SRQ); +5.0 (its target: held there); +31.0.
declare -A RATIO_MAX=([1]=3.68 [8]=2.97 [h1]=4.00 [s1]=3.32)
PASSTHROUGH_MAX=5
MANAGED_MAX=36

if [ -n "$guard" ]; then
    failed=0
    for b in "${ROWS[@]}"; do
        if awk -v a="${allocs[sqdisc/$b]}" 'BEGIN { exit !(a == 0) }'; then
            echo "PASS spdk provider $(row_label "$b"): 0 allocations per WR"
        else echo "FAIL spdk provider $(row_label "$b"): ${allocs[sqdisc/$b]} allocations per WR"; failed=1; fi
        if awk -v a="${instr[sqdisc/$b]}" -v v="${instr[verbs/$b]}" -v m="${RATIO_MAX[$b]}" 'BEGIN { exit !(a <= m * v) }'; then
            echo "PASS spdk provider $(row_label "$b"): ${instr[sqdisc/$b]} instructions per WR = $(ratio "${instr[sqdisc/$b]}" "${instr[verbs/$b]}") the verbs provider's (${instr[verbs/$b]}) <= ${RATIO_MAX[$b]}x"
        else echo "FAIL spdk provider $(row_label "$b"): ${instr[sqdisc/$b]} instructions per WR > ${RATIO_MAX[$b]}x the verbs provider's (${instr[verbs/$b]})"; failed=1; fi
    done
    for m in passthrough:$PASSTHROUGH_MAX:"a CQ with no managed QP on a patched context" managed:$MANAGED_MAX:"a managed CQ"; do
        mode=${m%%:*} rest=${m#*:}
        max=${rest%%:*} what=${rest#*:}
        over=$(awk -v p="${poll[$mode]}" -v u="${poll[unpatched]}" 'BEGIN { printf "%.1f", p - u }')
        if awk -v o="$over" -v m="$max" 'BEGIN { exit !(o <= m) }'; then
            echo "PASS spdk provider empty poll of $what: ${poll[$mode]} instructions = the device's ${poll[unpatched]} + $over (<= $max)"
        else echo "FAIL spdk provider empty poll of $what: ${poll[$mode]} instructions = the device's ${poll[unpatched]} + $over (> $max)"; failed=1; fi
    done
    [ "$failed" -eq 0 ]
    exit
fi

# Where sqdisc's provider spends its instructions, per WR (docs/perf/spdk-batch{1,8}.txt, spdk-host.txt): each entry point
# inclusive (--toggle-collect, N-request run minus 0-request run), and what of it is the provider's own work.
split() { # BATCH: one "name value" line per part
    local b=$1 t
    local args=(sqdisc -b "$b" -q "$QD")
    for t in spdk_rdma_provider_qp_queue_send_wrs spdk_rdma_provider_qp_flush_send_wrs sqdisc::queue::Queue::post_send \
        null_post_send 'sqdisc_spdk::interpose::poll_cq' 'sqdisc::cq::CqShared::poll_found' null_poll_cq; do
        echo "$t $(per_wr "$(cg "--toggle-collect=$t" -- "${args[@]}" -n "$N")" "$(cg "--toggle-collect=$t" -- "${args[@]}" -n 0)" $((4 * N)))"
    done
}
profile_doc() { # BATCH DST
    local b=$1 dst=$2
    local -A v
    while read -r k x; do v[$k]=$x; done < <(split "$b")
    local q=${v[spdk_rdma_provider_qp_queue_send_wrs]} f=${v[spdk_rdma_provider_qp_flush_send_wrs]}
    local cp=${v[sqdisc::queue::Queue::post_send]} dp=${v[null_post_send]}
    local p=${v['sqdisc_spdk::interpose::poll_cq']} cq=${v['sqdisc::cq::CqShared::poll_found']} dq=${v[null_poll_cq]}
    {
        echo "callgrind split of sqdisc's SPDK provider (benches/spdk_bench.c: requests of 3 unsignaled RDMA WRITEs + 1"
        echo "signaled SEND, $b request(s) per flush, qd $QD, one ibv_poll_cq per flush) on the null provider"
        echo "(benches/null_provider.c). Produced by \`make bench-spdk\` (scripts/bench-spdk.sh). Instructions per WR:"
        echo "each entry point inclusive (--toggle-collect, $N-request run minus 0-request run, / 4 WRs per request)."
        echo
        awk -v t="${instr[sqdisc/$b]}" -v v="${instr[verbs/$b]}" -v q="$q" -v f="$f" -v cp="$cp" -v dp="$dp" \
            -v p="$p" -v cq="$cq" -v dq="$dq" 'BEGIN {
            printf "%9.1f  total (the bench table), against %.1f for the verbs provider\n", t, v
            printf "%9.1f  spdk_rdma_provider_qp_queue_send_wrs: the provider (the list)\n", q
            printf "%9.1f  spdk_rdma_provider_qp_flush_send_wrs, of which:\n", f
            printf "%9.1f    the core'"'"'s Queue::post_send, without the device\n", cp - dp
            printf "%9.1f    the device'"'"'s post_send\n", dp
            printf "%9.1f    the provider'"'"'s own (list, domain lock, errno mapping, gate)\n", f - cp
            printf "%9.1f  ibv_poll_cq through the provider'"'"'s poll_cq, of which:\n", p
            printf "%9.1f    the core'"'"'s processing of the CQEs found (Cq::poll_found: releases, credits)\n", cq
            printf "%9.1f    the device'"'"'s poll_cq\n", dq
            printf "%9.1f    the provider'"'"'s own (route, turn, domain lock, owed flushes, gate)\n", p - cq - dq
            printf "%9.1f  the rest: the request loop (fill WRs, admission, completion accounting)\n", t - q - f - p
        }'
    } > "$dst"
}

# The same for the loops with receives (docs/perf/spdk-host.txt, spdk-srq.txt): two lists, two flushes, one poll
# per request. ROW: h1 (the host's, the QP's own receives) or s1 (the target's on an SRQ).
recv_doc() { # ROW DST
    local row=$1 dst=$2 t
    local args=(sqdisc $(row_args "$row") -q "$QD")
    local w
    w=$(row_wrs "$row")
    local queue_recv flush_recv core_recv dev_recv dev_send=null_post_send_echo dev_poll=null_poll_cq_echo what
    if [ "$row" = h1 ]; then
        queue_recv=spdk_rdma_provider_qp_queue_recv_wrs flush_recv=spdk_rdma_provider_qp_flush_recv_wrs
        core_recv=sqdisc::queue::Queue::post_recv dev_recv=null_post_recv_echo
        what="the host's loop (benches/spdk_bench.c -m host: per request one
response receive and one signaled capsule SEND, each queued on its list, both lists flushed, receives first,"
    else
        queue_recv=spdk_rdma_provider_srq_queue_recv_wrs flush_recv=spdk_rdma_provider_srq_flush_recv_wrs
        core_recv=sqdisc::srq::Srq::post_recv dev_recv=null_post_srq_recv
        dev_send=null_post_send_echo_srq dev_poll=null_poll_cq_echo_srq
        what="the target's loop on an SRQ (benches/spdk_bench.c -m srq: per
request the capsule's receive completion, the receive reposted to the SRQ's list, three unsignaled WRITEs and a
signaled SEND on the qpair's, both lists flushed, receives first,"
    fi
    local -A v
    for t in "$queue_recv" spdk_rdma_provider_qp_queue_send_wrs "$flush_recv" "$core_recv" "$dev_recv" \
        spdk_rdma_provider_qp_flush_send_wrs sqdisc::queue::Queue::post_send "$dev_send" \
        'sqdisc_spdk::interpose::poll_cq' 'sqdisc::cq::CqShared::poll_found' "$dev_poll"; do
        v[$t]=$(per_wr "$(cg "--toggle-collect=$t" -- "${args[@]}" -n "$N")" "$(cg "--toggle-collect=$t" -- "${args[@]}" -n 0)" $((w * N)))
    done
    {
        echo "callgrind split of sqdisc's SPDK provider in $what"
        echo "1 request per flush, qd $QD, one ibv_poll_cq per flush) on the null provider in echo mode"
        echo "(benches/null_provider.c). Produced by \`make bench-spdk\` (scripts/bench-spdk.sh). Instructions per WR:"
        echo "each entry point inclusive (--toggle-collect, $N-request run minus 0-request run, / $w WRs per request)."
        echo
        awk -v t="${instr[sqdisc/$row]}" -v vb="${instr[verbs/$row]}" -v qr="${v[$queue_recv]}" \
            -v qs="${v[spdk_rdma_provider_qp_queue_send_wrs]}" -v fr="${v[$flush_recv]}" -v frn="${flush_recv#spdk_rdma_provider_}" \
            -v cr="${v[$core_recv]}" -v crn="${core_recv#sqdisc::*::}" -v dr="${v[$dev_recv]}" \
            -v fs="${v[spdk_rdma_provider_qp_flush_send_wrs]}" -v cs="${v[sqdisc::queue::Queue::post_send]}" \
            -v ds="${v[$dev_send]}" -v p="${v[sqdisc_spdk::interpose::poll_cq]}" \
            -v cq="${v[sqdisc::cq::CqShared::poll_found]}" -v dq="${v[$dev_poll]}" 'BEGIN {
            printf "%9.1f  total (the bench table), against %.1f for the verbs provider\n", t, vb
            printf "%9.1f  the receives'"'"' and the sends'"'"' queue_*_wrs: the provider (the lists)\n", qr + qs
            printf "%9.1f  spdk_rdma_provider_%s, of which:\n", fr, frn
            printf "%9.1f    the core'"'"'s %s, without the device\n", cr - dr, crn
            printf "%9.1f    the device'"'"'s post_recv\n", dr
            printf "%9.1f    the provider'"'"'s own (list, domain lock, errno mapping)\n", fr - cr
            printf "%9.1f  spdk_rdma_provider_qp_flush_send_wrs, of which:\n", fs
            printf "%9.1f    the core'"'"'s Queue::post_send, without the device\n", cs - ds
            printf "%9.1f    the device'"'"'s post_send (with the echo of the SEND into the receive)\n", ds
            printf "%9.1f    the provider'"'"'s own (list, domain lock, errno mapping, gate)\n", fs - cs
            printf "%9.1f  ibv_poll_cq through the provider'"'"'s poll_cq, of which:\n", p
            printf "%9.1f    the core'"'"'s processing of the CQEs found (Cq::poll_found: releases, credits)\n", cq
            printf "%9.1f    the device'"'"'s poll_cq\n", dq
            printf "%9.1f    the provider'"'"'s own (route, turn, domain lock, owed flushes, gate)\n", p - cq - dq
            printf "%9.1f  the rest: the request loop (fill WRs, admission, completion accounting)\n", t - qr - qs - fr - fs - p
        }'
    } > "$dst"
}

table=$out/table.md
{
    echo "Measured $(date -u +%Y-%m-%d) at commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\` by \`make bench-spdk\`"
    echo "(benches/spdk_bench.c; $N requests: the target's, 3 unsignaled RDMA WRITEs + 1 signaled SEND, qd $QD, max_send_wr"
    echo "$((2 * QD)); the host's, 1 receive + 1 signaled SEND, qd $QD, max_send_wr = max_recv_wr = $QD; the target's on an SRQ,"
    echo "the capsule's receive + 3 WRITEs + 1 SEND, qd $QD, max_send_wr $((2 * QD)), an SRQ of $((2 * QD)) receives;"
    echo "the null provider, benches/null_provider.c; callgrind, N-request run minus 0-request run, per WR)."
    echo
    echo "| loop: requests per flush | instr/WR verbs provider | sqdisc provider | ratio | excl. device: verbs | sqdisc | ratio | allocs/WR sqdisc | CQEs/WR verbs · sqdisc | doorbells/WR |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    for b in "${ROWS[@]}"; do
        v=verbs/$b s=sqdisc/$b
        echo "| $(row_label "$b") | ${instr[$v]} | ${instr[$s]} | $(ratio "${instr[$s]}" "${instr[$v]}") | ${excl[$v]} | ${excl[$s]} | $(ratio "${excl[$s]}" "${excl[$v]}") | ${allocs[$s]} | ${cqes[$v]} · ${cqes[$s]} | ${bells[$s]} |"
    done
    echo
    echo "The target's loop with sqdisc's promises kept by hand in SPDK's own code, without a library (\`by-hand\`:"
    echo "the verbs provider's list and flush, the flush through \`benches/contract_by_hand.c\` and SPDK's poll"
    echo "through its poll; each WR checked, a token per WR and its wr_id kept, the chain restored, a CQE found by its"
    echo "token, successes released without a call): what the promises cost SPDK written directly, against the"
    echo "verbs provider and against libsqdisc_spdk."
    echo
    echo "| loop: requests per flush | instr/WR verbs provider | by hand | by hand / verbs | sqdisc provider | sqdisc / by hand |"
    echo "|---:|---:|---:|---:|---:|---:|"
    for b in "${BATCHES[@]}"; do
        echo "| $(row_label "$b") | ${instr[verbs/$b]} | ${instr[by-hand/$b]} | $(ratio "${instr[by-hand/$b]}" "${instr[verbs/$b]}") | ${instr[sqdisc/$b]} | $(ratio "${instr[sqdisc/$b]}" "${instr[by-hand/$b]}") |"
    done
} > "$table"
poll_table=$out/poll-table.md
{
    echo "Measured $(date -u +%Y-%m-%d) at commit \`$(git rev-parse --short HEAD 2>/dev/null || echo unknown)\` by \`make bench-spdk\`"
    echo "(benches/spdk_poll_bench.c; $POLLS polls of an empty CQ with ibv_poll_cq, 32 entries each; the null provider,"
    echo "benches/null_provider.c; callgrind, N-poll run minus 0-poll run, per poll)."
    echo
    echo "| CQ polled | instr/poll | vs. the device's op alone |"
    echo "|---|---:|---:|"
    echo "| context not patched (no qpair of this provider on the device): the device's op alone | ${poll[unpatched]} | 1.00x |"
    echo "| patched context, CQ with no managed QP: lookup, then the device's op | ${poll[passthrough]} | $(ratio "${poll[passthrough]}" "${poll[unpatched]}") (+$(awk -v p="${poll[passthrough]}" -v u="${poll[unpatched]}" 'BEGIN { printf "%.1f", p - u }')) |"
    echo "| managed CQ (a qpair of this provider on it): through sqdisc | ${poll[managed]} | $(ratio "${poll[managed]}" "${poll[unpatched]}") (+$(awk -v p="${poll[managed]}" -v u="${poll[unpatched]}" 'BEGIN { printf "%.1f", p - u }')) |"
} > "$poll_table"
cat "$table"
echo
cat "$poll_table"
if [ "${BENCH_NO_DOC:-}" != 1 ]; then
    for b in "${BATCHES[@]}"; do
        profile_doc "$b" docs/perf/spdk-batch$b.txt
    done
    recv_doc h1 docs/perf/spdk-host.txt
    recv_doc s1 docs/perf/spdk-srq.txt
    for section in bench-spdk:"$table" bench-spdk-poll:"$poll_table"; do
        awk -v t="${section#*:}" -v b="<!-- ${section%%:*}:begin -->" -v e="<!-- ${section%%:*}:end -->" '
            $0 == b { print; while ((getline l < t) > 0) print l; skip = 1; next }
            $0 == e { skip = 0 }
            !skip' docs/spdk.md > "$out/spdk.md" && mv "$out/spdk.md" docs/spdk.md
    done
fi
