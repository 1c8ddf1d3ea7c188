# The callgrind profile of the sqdisc poster that `make bench` writes to docs/perf/ (sourced by scripts/bench.sh,
# after bench-lib.sh's bench_init).
#
# profile PROVIDER BATCH N TOTAL DST   PROVIDER is sim or null; N counted WRs after the 1024-WR warm-up (1 SGE,
#                                      sq_depth 128); TOTAL the bench table's instructions per WR for the row.
#                                      Writes DST: a per-WR split by entry point, the library's functions (self
#                                      and inclusive), callgrind_annotate's lists and the library's hot lines.

# provider_ops PROVIDER: the provider's post_send and poll_cq as callgrind names them.
provider_ops() {
    case $1 in
        sim) echo "sqdisc_sim::ops::post_send sqdisc_sim::ops::poll_cq" ;;
        null) echo "null_post_send null_poll_cq" ;;
        *) echo "bench: unknown provider $1" >&2; exit 1 ;;
    esac
}

# profile_split PROVIDER N ARGS...: instructions per WR in sqd_post_send and sqd_cq_poll (each without the
# provider's op it calls), in run_releases, and in the provider's post_send and poll_cq, one per line.
profile_split() {
    local provider=$1 n=$2 post poll t
    shift 2
    read -r post poll <<< "$(provider_ops "$provider")"
    for t in "sqd_post_send $post" "sqd_cq_poll $poll" sqdisc::queue::QueueShared::run_releases "$post" "$poll"; do
        local opts=() f
        for f in $t; do opts+=("--toggle-collect=$f"); done
        cg_per_wr "$n" "${opts[@]}" -- "$@" -P "$provider"
        echo
    done
}

profile() {
    local provider=$1 b=$2 n=$3 total=$4 dst=$5
    local f=$out/cg/$provider-b$b.out args=(sqdisc -b "$b" -s 1 -d 128)
    mkdir -p "$out/cg" "$(dirname "$dst")"
    valgrind --tool=callgrind --callgrind-out-file="$f" --toggle-collect=measured "$bin/sqd_bench" "${args[@]}" \
        -P "$provider" -n "$n" > /dev/null 2>&1
    local parts what
    mapfile -t parts < <(profile_split "$provider" "$n" "${args[@]}")
    case $provider in
        sim) what="the software HCA in null mode (SQD_SIM_NULL)" ;;
        null) what="the null provider (benches/null_provider.c)" ;;
    esac
    local wrs=$((n + 1024))
    # callgrind_annotate lines "  1,234 (12.34%)  file:function [object]" with a first column added: per WR.
    local per='{ line = $0; if (match(line, /^ *[0-9,]+ /)) { v = substr(line, RSTART, RLENGTH); gsub(/[ ,]/, "", v);
                 printf "%9.1f  %s\n", v / n, line } else print line }'
    # Cost merged by function: inlined code is listed under the file it came from, once per file.
    local merge='/^ *[0-9,]+ \([ 0-9.]+%\)  / { v = $1; gsub(/,/, "", v); l = $0; sub(/^ *[0-9,]+ \([ 0-9.]+%\)  /, "", l);
                 sub(/ \[[^]]*\]$/, "", l); fn = l; if (fn !~ /^\?\?\?:/) sub(/^[^:]*:/, "", fn); else fn = substr(fn, 5);
                 s[fn] += v } END { for (x in s) if (s[x] / n >= 0.5) printf "%9.1f  %s\n", s[x] / n, x }'
    local self
    self=$(callgrind_annotate --auto=no --inclusive=no --threshold=100 "$f" 2>/dev/null | sed -n '/file:function/,$p' \
        | awk -v n="$wrs" "$merge" | sort -rn)
    # Inclusive costs by toggling collection on each function: callgrind_annotate's inclusive list splits a
    # function with inlined code over several file:function entries that cannot be added up.
    local post poll
    read -r post poll <<< "$(provider_ops "$provider")"
    local fns=(sqd_post_send sqdisc::queue::Queue::post_send sqdisc::queue::QueueShared::flush_run "$post"
        sqd_cq_poll sqdisc::cq::CqShared::poll sqdisc::cq::CqShared::cover_idle_tails
        sqdisc::queue::QueueShared::run_releases on_release "$poll")
    local -A incls
    local g
    for g in "${fns[@]}"; do
        incls[$g]=$(cg_per_wr "$n" "--toggle-collect=$g" -- "${args[@]}" -P "$provider")
    done
    {
        echo "callgrind profile of the sqdisc poster (benches/sqd_bench.c, sqdisc_run): batch $b, 1 SGE, sq_depth 128,"
        echo "signal interval 32, release callback, one sqd_cq_poll per post."
        echo "Provider: $what."
        echo "Only the measured loop is collected (--toggle-collect=measured, called for the 1024-WR warm-up and then"
        echo "$n WRs: $wrs WRs in all; the per-WR column of the lists divides by that)."
        echo "Produced by \`make bench\` (scripts/bench.sh); paths are relative to the repository. Numbers in the first"
        echo "column are instructions per WR."
        echo
        echo "==== where the instructions go (per WR; callgrind --toggle-collect, (I(2N) - I(N)) / N, N = $n) ===="
        printf '%9s  total (the bench table)\n' "$total"
        printf '%9s  sqd_post_send, without the provider'"'"'s post_send\n' "${parts[0]}"
        printf '%9s  sqd_cq_poll, without the provider'"'"'s poll_cq (releases included)\n' "${parts[1]}"
        printf '%9s    of which run_releases (release callbacks included)\n' "${parts[2]}"
        printf '%9s  the provider'"'"'s post_send\n' "${parts[3]}"
        printf '%9s  the provider'"'"'s poll_cq\n' "${parts[4]}"
        printf '%9s  the rest: the ULP loop (fill WRs, credit check, status check)\n' \
            "$(awk -v t="$total" -v a="${parts[0]}" -v b="${parts[1]}" -v c="${parts[3]}" -v d="${parts[4]}" \
                'BEGIN { printf "%.1f", t - a - b - c - d }')"
        echo
        echo "==== the library's functions, per WR: self (inlined code merged into its function, over all $wrs WRs) and"
        echo "==== inclusive (callees included, the provider's op too; --toggle-collect=FUNCTION, (I(2N) - I(N)) / N) ===="
        printf '%9s %9s  %s\n' self incl function
        local fn
        for fn in "${fns[@]}"; do
            printf '%9s %9s  %s\n' "$(awk -v f="$fn" '$2 == f { print $1 }' <<< "$self" | grep . || echo '<0.5')" \
                "${incls[$fn]}" "$fn"
        done
        echo
        echo "==== self cost by function, inlined code merged into its function (>= 0.5 per WR) ===="
        echo "$self"
        echo
        echo "==== callgrind_annotate: self (exclusive) cost by file:function ===="
        callgrind_annotate --auto=no --inclusive=no --threshold=98 "$f" 2>/dev/null | sed -n '/^Ir/,$p' | awk -v n="$wrs" "$per"
        echo
        echo "==== callgrind_annotate: inclusive cost by file:function ===="
        callgrind_annotate --auto=no --inclusive=yes --threshold=99.9 "$f" 2>/dev/null | sed -n '/^Ir/,$p' | awk -v n="$wrs" "$per"
        echo
        echo "==== the library's hot lines (src/queue.rs, src/cq.rs, src/discipline/*.rs; lines with a count) ===="
        callgrind_annotate --auto=yes --threshold=100 "$f" 2>/dev/null \
            | awk -v n="$wrs" '
                /^-- Auto-annotated source: / { keep = $0 ~ /[ \/]src\/(queue|cq)\.rs$/ || $0 ~ /[ \/]src\/discipline\//;
                                                if (keep) print "" }
                keep && (/^-- Auto-annotated source: / || /^-- line / || /^ *[0-9,]+ \(/) {
                    if (match($0, /^ *[0-9,]+ /)) { v = substr($0, RSTART, RLENGTH); gsub(/[ ,]/, "", v);
                        printf "%9.1f  %s\n", v / n, $0 } else print }'
    } | sed -e "s|$root/||g" -e 's/[ ]*$//' > "$dst"
}
