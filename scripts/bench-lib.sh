# Shared by scripts/bench.sh and scripts/bench-guard.sh (sourced, not run).
#
# bench_init STAGE_DIR LIBDIR_IN_STAGE   sets $root, $out, $bin and builds, against the staged install and only
#                                        through pkg-config (as a user would), build/bench/bin/sqd_bench (with
#                                        the null provider, benches/null_provider.c), null_provider_check,
#                                        contract_by_hand_check and alloc_count.so in build/bench/bin/
# cg_total [valgrind options --] ARGS    instructions callgrind counts for one run of sqd_bench ARGS
# per_wr FULL ZERO N                     (FULL - ZERO) / N with one decimal
# kv KEY LINE                            the value of KEY=... in a key=value line

bench_init() {
    local stage=$1 libdir=$2
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    out=$root/build/bench
    bin=$out/bin
    local lib=$stage$libdir
    if [ ! -f "$lib/pkgconfig/sqdisc.pc" ]; then
        echo "bench: no staged install in $stage" >&2
        exit 1
    fi
    bench_pc() {
        PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$lib/pkgconfig \
            PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
    }
    local cflags libs
    read -r -a cflags <<< "$(bench_pc --cflags sqdisc sqdisc_sim)"
    read -r -a libs <<< "$(bench_pc --libs sqdisc sqdisc_sim)"
    mkdir -p "$bin"
    local cc=${CC:-cc} strict=(-std=c11 -Wall -Wextra -Wpedantic -Werror)
    "$cc" "${strict[@]}" -O2 -g "${cflags[@]}" "$root/benches/sqd_bench.c" "$root/benches/null_provider.c" "$root/benches/contract_by_hand.c" \
        -o "$bin/sqd_bench" "${libs[@]}" -Wl,-rpath,"$lib"
    "$cc" "${strict[@]}" -O2 -g "${cflags[@]}" "$root/benches/null_provider_check.c" "$root/benches/null_provider.c" \
        -o "$bin/null_provider_check"
    "$cc" "${strict[@]}" -O2 -g "${cflags[@]}" "$root/benches/contract_by_hand_check.c" "$root/benches/contract_by_hand.c" \
        "$root/benches/null_provider.c" -o "$bin/contract_by_hand_check"
    "$cc" "${strict[@]}" -O2 -fPIC -shared "$root/benches/alloc_count.c" -o "$bin/alloc_count.so"
}

cg_total() {
    local vg=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do vg+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    local log
    log=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "${vg[@]}" "$bin/sqd_bench" "$@" 2>&1 >/dev/null) || {
        echo "bench: sqd_bench $* failed under callgrind:" >&2
        echo "$log" >&2
        exit 1
    }
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<< "$log"
}

per_wr() { awk -v f="$1" -v z="$2" -v n="$3" 'BEGIN { printf "%.1f", (f - z) / n }'; }

kv() { tr ' ' '\n' <<< "$2" | sed -n "s/^$1=//p"; }

# The callgrind options that count only the software HCA's ops (its post_send, poll_cq...), inclusive.
SIM_ONLY=('--toggle-collect=sqdisc_sim::ops::*')

# cg_per_wr N [valgrind options] -- ARGS   (I(2N) - I(N)) / N for sqd_bench ARGS: the setup, the warm-up and the
#                                          teardown are in both runs and cancel out
cg_per_wr() {
    local n=$1 vg=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do vg+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    per_wr "$(cg_total "${vg[@]}" -- "$@" -n $((2 * n)))" "$(cg_total "${vg[@]}" -- "$@" -n "$n")" "$n"
}

# The callgrind options that count only the null provider's ops (benches/null_provider.c), inclusive.
NULL_ONLY=(--toggle-collect=null_post_send --toggle-collect=null_poll_cq)

# The targets for sqdisc / hand-moderated raw verbs on the null provider, per batch size (docs/PERFORMANCE.md):
# the default API's, and those of batched releases on an indexed queue (which must also cost fewer instructions
# than signal-every-WR at batch 8 and 32, as the default API must).
declare -A NULL_TARGET=([1]=2.0 [8]=2.0 [32]=1.8)
declare -A INDEXED_TARGET=([1]=2.0 [8]=2.0 [32]=1.35)
