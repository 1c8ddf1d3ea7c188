#!/usr/bin/env bash
# Instructions per WR that the optional features add (precise MR tracking, buffer verification), counted by
# callgrind on the software HCA's null mode: each figure is (run of N WRs - run of 0 WRs) / N.
# usage: scripts/feature-cost.sh [N] [bytes per WR]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000} bytes=${2:-64}
cargo build --release --example feature_cost -q
bin=target/release/examples/feature_cost
count() { # mode wrs -> total instructions
    local out
    out=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" "$bytes" 2>&1 >/dev/null)
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' <<< "$out"
}
printf '%-9s %14s\n' mode "instr/WR"
for mode in baseline track verify; do
    zero=$(count "$mode" 0)
    full=$(count "$mode" "$n")
    per=$(( (full - zero) / n ))
    printf '%-9s %14s\n' "$mode" "$per"
    eval "per_$mode=$per"
done
echo "tracking adds $((per_track - per_baseline)) instructions per WR (4 tracked MRs, 1 SGE)"
echo "verification adds $((per_verify - per_baseline)) instructions per WR for $bytes bytes ($(( (per_verify - per_baseline) * 100 / bytes / 2 ))/100 per byte per pass, 2 passes)"
