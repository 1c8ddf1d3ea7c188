#!/usr/bin/env bash
# C programs that use the sim device as an unmodified verbs program does (c-tests/simdev/*.c), each run under
# `sqdisc-sim run` with a daemon of its own. Needs libibverbs' headers; builds sqdisc-sim and its preload first.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cargo build --release -q -p sqdisc-sim-daemon -p sqdisc-sim-preload
OUT=$ROOT/build/test/simdev
mkdir -p "$OUT"
export SQDISC_SIM_SOCKET=$OUT/sim/socket
export SQDISC_SIM_PRELOAD=$ROOT/target/release/libsqdisc_sim_preload.so
SIM=$ROOT/target/release/sqdisc-sim
failed=0
for src in c-tests/simdev/*.c; do
	name=$(basename "$src" .c)
	${CC:-cc} -std=c11 -Wall -Wextra -Werror -O1 "$src" -lrdmacm -libverbs -o "$OUT/$name"
	"$SIM" stop >/dev/null 2>&1 || true
	if timeout 120 "$SIM" run -- "$OUT/$name"; then echo "simdev-tests: $name passed"; else echo "simdev-tests: $name FAILED"; failed=1; fi
done
"$SIM" stop >/dev/null 2>&1 || true
exit "$failed"
