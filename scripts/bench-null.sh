# `make bench`, first part: what sqdisc itself costs per WR, on the null provider (benches/null_provider.c: a few
# instructions per WR), against the two raw-verbs posters; the memory of a queue at rest; the profiles of the
# sqdisc poster at batch 1, 8 and 32 (docs/perf/null-batchB.txt). Sourced by scripts/bench.sh after
# bench-lib.sh's bench_init and bench-profile.sh; null_section prints its part of the report (markdown).
#
# Instructions per WR are (I(2N) - I(N)) / N: two callgrind runs of the same workload with N and 2N counted WRs
# after the same 1024-WR warm-up, so setup, warm-up and teardown cancel out.

null_section() {
    local n=$1 depth=128 interval=32
    local batches=(1 8 32) posters=(raw-moderated raw-signal sqdisc sqdisc-batch sqdisc-lean sqdisc-indexed raw-lean by-hand by-hand-indexed)
    local -A ins prov cq al
    local b p
    for b in "${batches[@]}"; do
        for p in "${posters[@]}"; do
            local k=$p/$b args=("$p" -P null -b "$b" -s 1 -d "$depth")
            ins[$k]=$(cg_per_wr "$n" -- "${args[@]}")
            prov[$k]=$(cg_per_wr "$n" "${NULL_ONLY[@]}" -- "${args[@]}")
            local line
            line=$(LD_PRELOAD=$bin/alloc_count.so "$bin/sqd_bench" "${args[@]}" -n "$n")
            cq[$k]=$(kv cqes_per_wr "$line")
            al[$k]=$(kv allocs_per_wr "$line")
            [ -n "${al[$k]}" ] || { note "bench: the allocation counter was not loaded: $line"; exit 1; }
            if [ "${p#raw-}" = "$p" ]; then
                [ "$(kv q_send_cqes "$line")" = "$(kv cqes "$line")" ] && [ "$(kv q_doorbells "$line")" = "$(kv doorbells "$line")" ] \
                    || { note "bench: sqd_queue_stats disagrees with the null provider's counters: $line"; exit 1; }
                [ "$(kv q_parked "$line")" = 0 ] || { note "bench: WRs went through the backlog: $line"; exit 1; }
            fi
            note "$(printf 'null provider: %-14s batch %2s: %7s instr/WR (provider %5s) cqes/WR %s allocs/WR %s' \
                "$p" "$b" "${ins[$k]}" "${prov[$k]}" "${cq[$k]}" "${al[$k]}")"
        done
    done

    # Memory at rest: sqd_queue_stats.bytes, and the heap sqd_queue_new takes (through the shim) for the first
    # queue on a fresh CQ and for a second one on the same CQ. max_inline_data 64 throughout. With a backlog,
    # also on a CQ whose backlog pool is limited to one queue's backlog (sqd_cq_set_backlog_limit): the first
    # queue makes the pool's room, the second takes none.
    local -A mbytes mheap mheap2 mal2 lbytes lheap2 lal2 lpool
    local d s kk
    for d in 16 128 256; do
        for s in 1 4 16; do
            for kk in 0 "$d"; do
                local line
                line=$(LD_PRELOAD=$bin/alloc_count.so "$bin/sqd_bench" memory -P null -d "$d" -s "$s" -k "$kk" -q 2)
                mbytes[$d/$s/$kk]=$(kv bytes "$line")
                mheap[$d/$s/$kk]=$(kv heap_bytes "$line")
                mheap2[$d/$s/$kk]=$(kv last_heap_bytes "$line")
                mal2[$d/$s/$kk]=$(kv last_allocs "$line")
                if [ "$kk" != 0 ]; then
                    line=$(LD_PRELOAD=$bin/alloc_count.so "$bin/sqd_bench" memory -P null -d "$d" -s "$s" -k "$kk" -q 2 -L "$kk")
                    lbytes[$d/$s/$kk]=$(kv last_bytes "$line")
                    lheap2[$d/$s/$kk]=$(kv last_heap_bytes "$line")
                    lal2[$d/$s/$kk]=$(kv last_allocs "$line")
                    lpool[$d/$s/$kk]=$(kv pool_bytes "$line")
                fi
            done
        done
    done
    note "memory: measured 18 queue shapes on the null provider"

    # Poll cost per CQE against the number of queues on the CQ (scale mode: every WR signaled by the ULP, WR k to
    # queue k mod Q, the CQ polled until empty every 8 posts): sqd_cq_poll inclusive, the provider's poll_cq too.
    local -A spoll
    local qn
    for qn in 1 100 10000; do
        local warm=$((2 * qn > 1024 ? 2 * qn : 1024))
        spoll[$qn]=$(cg_per_wr "$n" --toggle-collect=sqd_cq_poll -- scale -P null -q "$qn" -d 16 -p 8 -w "$warm")
        note "null provider: scale $qn queues: sqd_cq_poll ${spoll[$qn]} instr/CQE"
    done

    for b in "${batches[@]}"; do
        note "profile: null provider, batch $b -> docs/perf/null-batch$b.txt"
        profile null "$b" "$n" "${ins[sqdisc/$b]}" "docs/perf/null-batch$b.txt"
    done

    ratio2() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
    join_dot() { local out=$1; shift; for x in "$@"; do out+=" · $x"; done; echo "$out"; }
    # The target column for ratio $2 at batch $1, and whether $3 instructions per WR are fewer than $4's
    # (signal-every-WR; no target at batch 1).
    target_cell() { echo "<= ${NULL_TARGET[$1]} ($(awk -v r="$2" -v t="${NULL_TARGET[$1]}" 'BEGIN { print (r <= t ? "met" : "not met") }'))"; }
    indexed_target_cell() { echo "<= ${INDEXED_TARGET[$1]} ($(awk -v r="$2" -v t="${INDEXED_TARGET[$1]}" 'BEGIN { print (r <= t ? "met" : "not met") }'))"; }
    fewer_cell() {
        if [ "$1" = 1 ]; then echo "(no target)"; else awk -v q="$2" -v a="$3" 'BEGIN { print (q < a ? "yes" : "no") }'; fi
    }
    local hp=${prov[raw-moderated/32]} hp1=${prov[raw-moderated/1]}

    echo "### sqdisc on a null provider"
    echo
    echo "The posters below run on \`benches/null_provider.c\`, a verbs provider of a few instructions per WR (its"
    echo "post_send records each WQE and completes it at once, a CQE for a signaled WQE; its poll_cq pops CQEs, and a"
    echo "CQE frees every SQ slot up to its WQE; a post with every SQ slot taken fails with ENOMEM). What is left is"
    echo "the poster's own work: the library and the ULP's loop. Workload as in the next section: one RC QP,"
    echo "sq_depth $depth, 1 SGE, SEND WRs posted as one chain per batch, one poll (up to 32 completions) per post;"
    echo "sqdisc with the default signal interval ($interval) and a release callback. Instructions per WR by callgrind,"
    echo "(I(2N) - I(N)) / N with N = $n after a 1024-WR warm-up, so setup and teardown cancel out."
    echo
    echo "| batch | hand-moderated raw | signal-every-WR raw | sqdisc | sqdisc / hand-mod | target | sqdisc < signal-every-WR |"
    echo "|---:|---:|---:|---:|---:|---:|---|"
    for b in "${batches[@]}"; do
        local m=${ins[raw-moderated/$b]} a=${ins[raw-signal/$b]} q=${ins[sqdisc/$b]} r
        r=$(ratio2 "$q" "$m")
        echo "| $b | $m | $a | **$q** | **$r** | $(target_cell "$b" "$r") | $(fewer_cell "$b" "$q" "$a") |"
    done
    echo
    echo "The same workload with the opt-in options of the API that cut per-WR work: batched releases"
    echo "(\`sqd_queue_set_release_batch\`: one callback per run of releases, with their wr_ids; the callback counts"
    echo "them); those together with \`SQD_QUEUE_NO_RESTORE\` (the posted WRs are not restored after the post; the"
    echo "loop fills every WR before each post anyway); and batched releases on a queue with \`SQD_QUEUE_INDEXED\`"
    echo "(WRs named by their index: no wr_id kept or handed back, no restore; the callback checks that each batch"
    echo "starts at the index it expects, then counts):"
    echo
    echo "| batch | batched releases | / hand-mod | batched + NO_RESTORE | / hand-mod | batched + INDEXED | / hand-mod | target | indexed < signal-every-WR |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for b in "${batches[@]}"; do
        local m=${ins[raw-moderated/$b]} a=${ins[raw-signal/$b]} qb=${ins[sqdisc-batch/$b]} ql=${ins[sqdisc-lean/$b]} qi=${ins[sqdisc-indexed/$b]} ri
        ri=$(ratio2 "$qi" "$m")
        echo "| $b | $qb | $(ratio2 "$qb" "$m") | $ql | $(ratio2 "$ql" "$m") | **$qi** | **$ri** | $(indexed_target_cell "$b" "$ri") | $(fewer_cell "$b" "$qi" "$a") |"
    done
    echo
    echo "The same sqdisc posters against a leaner hand-moderated poster (\`raw-lean\`: its loop in one function with"
    echo "its counters in locals, the ring index as wr_id, one poll of up to 32 per post), so that no ratio is"
    echo "flattered by the baseline:"
    echo
    echo "| batch | lean hand-moderated raw | sqdisc / lean | batched / lean | batched + NO_RESTORE / lean | batched + INDEXED / lean |"
    echo "|---:|---:|---:|---:|---:|---:|"
    for b in "${batches[@]}"; do
        local l=${ins[raw-lean/$b]}
        echo "| $b | $l | $(ratio2 "${ins[sqdisc/$b]}" "$l") | $(ratio2 "${ins[sqdisc-batch/$b]}" "$l") | $(ratio2 "${ins[sqdisc-lean/$b]}" "$l") | $(ratio2 "${ins[sqdisc-indexed/$b]}" "$l") |"
    done
    echo
    echo "The same promises kept by hand in plain C, without sqdisc (\`benches/contract_by_hand.c\`, with the sqdisc"
    echo "posters' loop and callbacks: each WR checked, a token as its wr_id and the ULP's kept in a ring slot,"
    echo "moderated signaling, the chain restored, a CQE found by its token, the releases in order, an idle tail"
    echo "covered; no backlog, locks or deferred actions): what a ULP would pay to keep them itself. \`by-hand\` keeps"
    echo "the default API's (a release callback per WR), \`by-hand-indexed\` the indexed poster's (WRs named by"
    echo "index, a batch callback per run, nothing restored):"
    echo
    echo "| batch | by hand | / hand-mod | sqdisc / by hand | indexed, by hand | / hand-mod | sqdisc indexed / by hand |"
    echo "|---:|---:|---:|---:|---:|---:|---:|"
    for b in "${batches[@]}"; do
        local m=${ins[raw-moderated/$b]} h=${ins[by-hand/$b]} hi=${ins[by-hand-indexed/$b]}
        echo "| $b | $h | $(ratio2 "$h" "$m") | $(ratio2 "${ins[sqdisc/$b]}" "$h") | $hi | $(ratio2 "$hi" "$m") | $(ratio2 "${ins[sqdisc-indexed/$b]}" "$hi") |"
    done
    echo
    echo "| batch | the provider's own instr/WR: hand-mod · signal-every-WR · sqdisc · batched · lean · indexed · lean hand-mod · by hand · indexed by hand | CQEs/WR: the same posters | heap allocations/WR: the same posters |"
    echo "|---:|---|---|---|"
    for b in "${batches[@]}"; do
        local pp=() cc=() aa=()
        for p in "${posters[@]}"; do
            pp+=("${prov[$p/$b]}")
            cc+=("${cq[$p/$b]}")
            aa+=("${al[$p/$b]}")
        done
        echo "| $b | $(join_dot "${pp[@]}") | $(join_dot "${cc[@]}") | $(join_dot "${aa[@]}") |"
    done
    echo
    echo "Poll cost against the number of queues on one CQ (every WR signaled by the ULP, WR k to queue k mod Q, queues"
    echo "of depth 16, the CQ polled until empty every 8 posts): \`sqd_cq_poll\` costs ${spoll[1]} instructions per CQE"
    echo "with 1 queue, ${spoll[100]} with 100 and ${spoll[10000]} with 10,000 (ratio $(ratio2 "${spoll[10000]}" "${spoll[1]}"); the provider's poll_cq"
    echo "included)."
    echo
    echo "The null provider itself costs $hp1 (batch 1) to $hp (batch 32) instructions per WR for the hand-moderated"
    echo "poster (its post_send and poll_cq, counted with callgrind --toggle-collect). The targets column is the goal"
    echo "of the hot-path work still to come, not a result; \`make bench-guard\` checks today's ratios with a margin."
    echo
    echo "### Memory of a queue at rest"
    echo
    echo "\`sqd_queue_stats.bytes\` (the queue's fixed part, 16 bytes per SQ slot rounded up to a power of two, and"
    echo "what its creation added to its CQ's backlog pool), and the heap \`sqd_queue_new\` takes, measured by"
    echo "\`benches/alloc_count.so\` (malloc_usable_size): for the first queue on a fresh CQ (which also sizes the CQ's"
    echo "queue table) and for a second queue on the same CQ. max_inline_data 64. The backlog is the sqdisc default"
    echo "(as deep as the SQ) or 0. Parked WRs take their storage from the CQ's backlog pool. Without a limit the pool"
    echo "holds every queue's whole backlog, so each queue's creation adds its room (columns 4 to 6); with"
    echo "\`sqd_cq_set_backlog_limit\` set to one queue's backlog, the first queue makes the pool's room and a second"
    echo "queue takes none (columns 7 to 9: the second queue, and the pool)."
    echo
    echo "| sq_depth | max_send_sge | backlog | bytes (stats) | heap, first queue | heap, next queue (allocations) | limited pool: bytes of the next queue (stats) | heap, next queue (allocations) | pool bytes |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for d in 16 128 256; do
        for s in 1 4 16; do
            for kk in 0 "$d"; do
                local key=$d/$s/$kk
                if [ "$kk" = 0 ]; then
                    echo "| $d | $s | $kk | ${mbytes[$key]} | ${mheap[$key]} | ${mheap2[$key]} (${mal2[$key]}) | | | |"
                else
                    echo "| $d | $s | $kk | ${mbytes[$key]} | ${mheap[$key]} | ${mheap2[$key]} (${mal2[$key]}) | ${lbytes[$key]} | ${lheap2[$key]} (${lal2[$key]}) | ${lpool[$key]} |"
                fi
            done
        done
    done
    echo
    local spdk=${lbytes[256/16/256]} spdk_heap=${lheap2[256/16/256]}
    local worst=$(( spdk > spdk_heap ? spdk : spdk_heap ))
    echo "Target: a queue of depth 256, 16 SGEs and a 256-deep backlog at most 16 KB (16384 bytes) at rest, with"
    echo "parked WRs taken from a pool shared per CQ. Today, on a CQ whose pool is limited: $spdk bytes (stats),"
    echo "$spdk_heap bytes of heap ($(awk -v x="$worst" 'BEGIN { print (x <= 16384 ? "met" : "not met") }')). Without a limit the pool holds every"
    echo "queue's whole backlog: ${mbytes[256/16/256]} bytes for that queue, its room in the pool included."
    echo
}
