#!/usr/bin/env bash
# What libsqdisc_check costs: instructions per WR of check/bench/check_bench.c (a hand-moderated raw poster on
# the null provider of benches/null_provider.c) with the checker not attached, attached with sampling off, and
# sampling one WR in 64 (the default) and every WR. Instructions per WR are (I(2N) - I(N)) / N from two
# callgrind runs, so setup, warm-up and teardown cancel out. Prints a markdown table (docs/check.md).
# usage: bench-check.sh STAGE_DIR LIBDIR_IN_STAGE [N]
set -euo pipefail
stage=$1 libdir=$2 n=${3:-8192}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/bench-check
CC=${CC:-cc}
stage_lib=$stage$libdir
pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage_lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
mkdir -p "$out"
read -r -a cflags <<< "$(pc --cflags sqdisc_check)"
read -r -a libs <<< "$(pc --libs sqdisc_check)"
"$CC" -std=gnu11 -O2 -g "${cflags[@]}" "$root/check/bench/check_bench.c" "$root/benches/null_provider.c" \
    -o "$out/check_bench" "${libs[@]}" -libverbs -Wl,-rpath,"$stage_lib"

total() { # args...: instructions of one run
    local f=$out/cg.out
    valgrind --tool=callgrind --callgrind-out-file="$f" "$out/check_bench" "$@" > /dev/null 2>&1
    sed -n 's/^summary: *//p; s/^totals: *//p' "$f" | head -n 1 | awk '{ print $1 }'
}
per_wr() { # mode batch sample
    local a b
    a=$(total "$1" "$2" "$n" "$3")
    b=$(total "$1" "$2" $((2 * n)) "$3")
    awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN { printf "%.0f", (b - a) / n }'
}
echo "| batch | raw poster + null provider | + checker, sampling off | + checker, 1 WR in 64 sampled | + checker, every WR sampled |"
echo "|---|---|---|---|---|"
for batch in 1 8 32; do
    plain=$(per_wr plain "$batch" 0)
    off=$(per_wr check "$batch" 0)
    s64=$(per_wr check "$batch" 64)
    s1=$(per_wr check "$batch" 1)
    echo "| $batch | $plain | $off (+$((off - plain))) | $s64 (+$((s64 - plain))) | $s1 (+$((s1 - plain))) |"
done
