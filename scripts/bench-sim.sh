#!/usr/bin/env bash
# `make bench-sim` (and the end of `make bench`): small-message rate and latency of the software HCA as a device
# for unmodified programs, between two processes through the device daemon (perftest's ib_send_bw and
# ib_send_lat, 64-byte SENDs), against the same measurement on the in-process sim (examples/sim_rate.rs, the
# same loop shapes in one thread). Wall-clock figures: the medians of BENCH_SIM_REPS runs, information only,
# nothing is asserted on them. Writes docs/perf/sim-device.txt (with the machine, the commit and the
# command) unless BENCH_NO_DOC=1.
#
# usage: scripts/bench-sim.sh
# env:   BENCH_SIM_BW_N (SENDs per bandwidth run, default 200000), BENCH_SIM_LAT_N (round trips per latency run,
#        default 20000), BENCH_SIM_REPS (runs of each, default 3), BENCH_SIM_PORT (first TCP port, default 18900)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

BW_N=${BENCH_SIM_BW_N:-200000}
LAT_N=${BENCH_SIM_LAT_N:-20000}
REPS=${BENCH_SIM_REPS:-3}
port=${BENCH_SIM_PORT:-18900}

for tool in ib_send_bw ib_send_lat; do
    command -v "$tool" >/dev/null || { echo "bench-sim: $tool is missing (Debian package perftest: scripts/install-deps.sh check)" >&2; exit 1; }
done

${CARGO:-cargo} build -q --release -p sqdisc-sim-daemon -p sqdisc-sim-preload
${CARGO:-cargo} build -q --release --example sim_rate
target=${CARGO_TARGET_DIR:-target}/release
sim=$target/sqdisc-sim
export SQDISC_SIM_PRELOAD=$root/$target/libsqdisc_sim_preload.so
work=$(mktemp -d /tmp/sqdisc-bench-sim.XXXXXX)
export SQDISC_SIM_SOCKET=$work/socket
cleanup() {
    "$sim" stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
"$sim" start ${BENCH_SIM_TICK_US:+--tick-us $BENCH_SIM_TICK_US} >/dev/null

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# One perftest run, server and client: prints the client's figure (MsgRate in Mpps, or t_avg in usec).
perftest() {
    local tool=$1 n=$2
    port=$((port + 1))
    timeout 120 "$sim" run -- "$tool" -s 64 -n "$n" -p "$port" >"$work/server.log" 2>&1 &
    local server=$!
    sleep 0.5
    timeout 120 "$sim" run -- "$tool" -s 64 -n "$n" -p "$port" 127.0.0.1 >"$work/client.log" 2>&1
    wait "$server"
    if grep -qiE "couldn't|failed|error" "$work/server.log" "$work/client.log"; then
        cat "$work/server.log" "$work/client.log" >&2
        echo "bench-sim: $tool failed" >&2
        exit 1
    fi
    # The results line follows the column header ("#bytes ..."): MsgRate is its last column for bw, t_avg
    # its sixth for lat.
    awk -v tool="$tool" '/#bytes/ { getline; if (tool == "ib_send_bw") print $NF * 1e6; else print $6 }' "$work/client.log"
}

bw_daemon=$(for _ in $(seq "$REPS"); do perftest ib_send_bw "$BW_N"; done | median)
lat_daemon=$(for _ in $(seq "$REPS"); do perftest ib_send_lat "$LAT_N"; done | median)
bw_inproc=$(for _ in $(seq "$REPS"); do "$target/examples/sim_rate" bw "$BW_N" | awk '{ print $2 }'; done | median)
lat_inproc=$(for _ in $(seq "$REPS"); do "$target/examples/sim_rate" lat "$LAT_N" | awk '{ print $2 }'; done | median)

report=$work/report.txt
{
    echo "# The software HCA as a device: two processes through the daemon, against the in-process sim"
    echo
    echo "machine: $(nproc) CPUs, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), load average at start $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "command: make bench-sim (BENCH_SIM_BW_N=$BW_N BENCH_SIM_LAT_N=$LAT_N BENCH_SIM_REPS=$REPS), medians of $REPS runs"
    echo
    printf '| %-38s | %22s | %22s |\n' "64-byte SENDs" "through the daemon" "in-process sim"
    printf '| %-38s | %22s | %22s |\n' "--------------------------------------" "----------------------" "----------------------"
    printf '| %-38s | %22.0f | %22.0f |\n' "message rate (ib_send_bw), per second" "$bw_daemon" "$bw_inproc"
    printf '| %-38s | %22.2f | %22.2f |\n' "latency (ib_send_lat, t_avg), us" "$lat_daemon" "$lat_inproc"
} >"$report"
cat "$report"
if [ "${BENCH_NO_DOC:-0}" != 1 ]; then
    cp "$report" docs/perf/sim-device.txt
    echo "bench-sim: wrote docs/perf/sim-device.txt"
fi
