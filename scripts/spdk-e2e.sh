#!/usr/bin/env bash
# Real SPDK, end to end, over the sim device (sqdisc-sim): its NVMe-oF target (nvmf_tgt, RDMA transport, a
# Malloc bdev) and, in a second process, its NVMe-RDMA host (spdk_nvme_identify, spdk_nvme_perf, bdevperf
# -w verify), each workload twice: with SPDK's own RDMA provider, then with libsqdisc_spdk preloaded into the
# target and the host. Prints a table. Downloads nothing: the SPDK tree is the caller's.
#
#   SPDK_SRC=/path/to/spdk   an SPDK release's source tree with its DPDK in dpdk/ (see docs/spdk.md); it is
#                            copied to build/e2e/spdk-v<major>.<minor>/ and built there (once; reused after)
#   SPDK_BUILD=/path         an SPDK tree already built as below: used as is (instead of SPDK_SRC)
#   JOBS=2                   make's -j
#   MODES="spdk sqdisc"      providers: spdk (SPDK's own), sqdisc (libsqdisc_spdk preloaded)
#   TRANSPORTS="srq nosrq"   the RDMA transport with its per-poll-group SRQ, and made with --no-srq
#   SIZES="4 8 16 64 128"    bdevperf verify I/O sizes, KiB
#   QDS="1 2 4 8 16 32 64"   bdevperf queue depths
#   TIME=3                   seconds per perf/bdevperf run
#   SIM_ARGS=""              settings of the sim daemon (e.g. "--loss-ppm 2000 --ack-loss-ppm 2000 --seed 7")
#   BUILD_ONLY=1             build SPDK, run nothing
#   E2E_DIR=build/e2e        where SPDK is built and the runs keep their logs (run/) and their sim daemon
#   SQDISC_PREBUILT=1        do not (re)build sqdisc-sim, its preload library and libsqdisc_spdk first
#   PAIRED=1                 each workload with each provider in turn, on a fresh target (slower; fairer IOPS)
#   REPEAT=1                 with PAIRED=1: pairs per workload, the providers' order swapped every other pair;
#                            a summary gives each workload's ratios (libsqdisc_spdk over SPDK's) and their median
#   ONLY=""                  a regular expression: run only the workloads whose name matches (e.g. 'verify 8k qd32')
#
# Exit status: 0 when every run passed (exit 0, no verify failure, the target exits on SIGTERM), else 1.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
E2E=${E2E_DIR:-$ROOT/build/e2e}
JOBS=${JOBS:-2}
MODES=${MODES:-"spdk sqdisc"}
TRANSPORTS=${TRANSPORTS:-"srq nosrq"}
SIZES=${SIZES:-"4 8 16 64 128"}
QDS=${QDS:-"1 2 4 8 16 32 64"}
TIME=${TIME:-3}
SIM_ARGS=${SIM_ARGS:-}
ONLY=${ONLY:-}
NQN=nqn.2016-06.io.spdk:cnode1
TRID="trtype:RDMA adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420"
RUN_LIMIT=$((TIME + 45))

die() { echo "spdk-e2e: $*" >&2; exit 2; }
say() { echo "spdk-e2e: $*" >&2; }

# SPDK's build runs python3 with tabulate, jinja2 and elftools; a python3 first on PATH without them (a
# virtual environment, pyenv) is passed over for the system's.
py_ok() { "$1" -c 'import tabulate, jinja2, elftools' 2>/dev/null; }
mkdir -p "$E2E/bin"
if ! py_ok python3; then
	py_ok /usr/bin/python3 || die "python3 needs the modules tabulate, jinja2 and elftools (Debian: python3-tabulate python3-jinja2 python3-pyelftools)"
	ln -sf /usr/bin/python3 "$E2E/bin/python3"
	export PATH="$E2E/bin:$PATH"
fi

# --- SPDK -----------------------------------------------------------------------------------------------
spdk_version() { echo "v$(cut -d. -f1,2 "$1/VERSION")"; }   # VERSION holds e.g. 26.05.0
CONFIGURE=(--with-rdma --with-shared --disable-tests --disable-unit-tests --disable-examples --without-nvme-cuse
	--without-vhost --without-virtio --without-fsdev)
if [[ -n "${SPDK_BUILD:-}" ]]; then
	SPDK=$SPDK_BUILD
else
	[[ -n "${SPDK_SRC:-}" ]] || die "set SPDK_SRC to an SPDK release's source tree (its DPDK in dpdk/), or SPDK_BUILD to a built one"
	[[ -f "$SPDK_SRC/VERSION" && -f "$SPDK_SRC/lib/nvmf/rdma.c" ]] || die "$SPDK_SRC is not an SPDK source tree"
	[[ -f "$SPDK_SRC/dpdk/meson.build" ]] || die "$SPDK_SRC/dpdk has no DPDK source tree (SPDK's submodule, or DPDK's own release)"
	SPDK=$E2E/spdk-$(spdk_version "$SPDK_SRC")
	if [[ ! -x "$SPDK/build/examples/bdevperf" ]]; then
		if [[ ! -f "$SPDK/.sqdisc-copied" ]]; then
			rm -rf "$SPDK"; mkdir -p "$SPDK"
			cp -a "$SPDK_SRC/." "$SPDK/"
			touch "$SPDK/.sqdisc-copied"
		fi
		# Without the isa-l submodule: an empty autogen.sh satisfies configure, which then leaves ISA-L (and
		# with it crypto and compression) out when there is no nasm 2.14 or newer.
		if [[ ! -f "$SPDK/isa-l/autogen.sh" ]]; then
			mkdir -p "$SPDK/isa-l"; printf '#!/bin/sh\n' > "$SPDK/isa-l/autogen.sh"; chmod +x "$SPDK/isa-l/autogen.sh"
		fi
		# An option a release's configure does not know (v25.05 has no --without-fsdev) is left out: that
		# release has nothing to leave out by it.
		known=()
		for opt in "${CONFIGURE[@]}"; do
			if grep -q -- "^[[:space:]]*$opt)" "$SPDK/configure"; then known+=("$opt"); else say "configure of $SPDK has no $opt: left out"; fi
		done
		CONFIGURE=("${known[@]}")
		say "building SPDK in $SPDK (configure ${CONFIGURE[*]}; make -j$JOBS; log $SPDK/sqdisc-build.log)"
		( cd "$SPDK" && ./configure "${CONFIGURE[@]}" && make -j"$JOBS" && make -C examples/bdev/bdevperf -j"$JOBS" ) \
			> "$SPDK/sqdisc-build.log" 2>&1 || { tail -30 "$SPDK/sqdisc-build.log" >&2; die "the SPDK build failed"; }
	fi
fi
for b in build/bin/nvmf_tgt build/bin/spdk_nvme_identify build/bin/spdk_nvme_perf build/examples/bdevperf; do
	[[ -x "$SPDK/$b" ]] || die "$SPDK/$b is missing"
done
[[ ${BUILD_ONLY:-0} == 1 ]] && { say "SPDK built in $SPDK"; exit 0; }
PROVIDER=$(cd "$SPDK/build/lib" && ls libspdk_rdma_provider.so.* | sort | tail -1)
export LD_LIBRARY_PATH="$SPDK/build/lib:$SPDK/dpdk/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
RPC=("$SPDK/scripts/rpc.py")

# --- sqdisc's pieces ----------------------------------------------------------------------------------
# (SQDISC_PREBUILT=1: use them as built; two runs at once must not rebuild them under each other.)
if [[ ${SQDISC_PREBUILT:-0} != 1 ]]; then
	( cd "$ROOT" && cargo build --release -q -p sqdisc-sim-daemon -p sqdisc-sim-preload && make -s spdk-shim ) >&2
fi
SIM=$ROOT/target/release/sqdisc-sim
SIM_PRELOAD=$ROOT/target/release/libsqdisc_sim_preload.so
SHIM=$ROOT/build/lib/libsqdisc_spdk.so.0
RUN=$E2E/run
mkdir -p "$RUN"
export SQDISC_SIM_SOCKET=$RUN/sim/socket

sim_start() {
	"$SIM" stop >/dev/null 2>&1 || true
	# shellcheck disable=SC2086
	"$SIM" start $SIM_ARGS >/dev/null
}

# The environment of an SPDK process of mode $1: the sim's preload last, libsqdisc_spdk before it.
preload_for() { if [[ $1 == sqdisc ]]; then echo "$SHIM $SIM_PRELOAD"; else echo "$SIM_PRELOAD"; fi; }

TPID=
TLOG=
target_start() { # mode transport
	local mode=$1 tr=$2 i
	sim_start
	TLOG=$RUN/nvmf_tgt-$mode-$tr.log
	rm -f "$RUN/tgt.sock"
	LD_PRELOAD="$(preload_for "$mode")" SQDISC_SPDK_STATS=1 SQDISC_SIM_QP_STATS=1 \
		"$SPDK/build/bin/nvmf_tgt" --disable-cpumask-locks --no-huge -s 1024 -m 0x1 -r "$RUN/tgt.sock" > "$TLOG" 2>&1 &
	TPID=$!
	for i in $(seq 100); do
		"${RPC[@]}" -s "$RUN/tgt.sock" -t 1 spdk_get_version >/dev/null 2>&1 && break
		kill -0 "$TPID" 2>/dev/null || { tail -20 "$TLOG" >&2; die "nvmf_tgt exited at start"; }
		sleep 0.3
	done
	local srqflag=(); [[ $tr == nosrq ]] && srqflag=(--no-srq)
	{
		"${RPC[@]}" -s "$RUN/tgt.sock" nvmf_create_transport -t RDMA "${srqflag[@]}"
		"${RPC[@]}" -s "$RUN/tgt.sock" bdev_malloc_create -b Malloc0 64 512
		"${RPC[@]}" -s "$RUN/tgt.sock" nvmf_create_subsystem "$NQN" -a -s SQDISC00000000000001
		"${RPC[@]}" -s "$RUN/tgt.sock" nvmf_subsystem_add_ns "$NQN" Malloc0
		"${RPC[@]}" -s "$RUN/tgt.sock" nvmf_subsystem_add_listener "$NQN" -t rdma -f ipv4 -a 127.0.0.1 -s 4420
	} > "$RUN/rpc.log" 2>&1 || {
		cat "$RUN/rpc.log" >&2; tail -20 "$TLOG" >&2
		# The target is not left running (nor its RPC socket in use) for the next invocation.
		kill -KILL "$TPID" 2>/dev/null || true; wait "$TPID" 2>/dev/null || true
		"$SIM" stop >/dev/null 2>&1 || true
		die "configuring nvmf_tgt failed"
	}
}

# SIGTERM; the target must exit within 20 s. Sets ST to its exit status, or "hang" (then SIGKILL).
ST=
target_stop() {
	kill -TERM "$TPID" 2>/dev/null || true
	local i
	for i in $(seq 200); do kill -0 "$TPID" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$TPID" 2>/dev/null; then
		"${RPC[@]}" -s "$RUN/tgt.sock" -t 2 nvmf_get_stats > "$TLOG.hang-stats.json" 2>&1 || true
		kill -KILL "$TPID" 2>/dev/null || true
		wait "$TPID" 2>/dev/null || true
		ST=hang
	else
		ST=0; wait "$TPID" || ST=$?
	fi
	TPID=
}

# sqdisc's counters of a process's qpairs, from the lines libsqdisc_spdk logs when SQDISC_SPDK_STATS=1:
# qpairs/WRs/markers/moderation signals/backlogged/stray CQEs/late CQEs, then the error completions it
# handed SPDK: flushes from the device's CQEs (sends+receives), its own flushes, other errors, duplicates,
# owed and never handed; summed over its qpairs.
sqd_counters() { # [skip=N] file: the lines after the first N
	local skip=0; [[ $1 == skip=* ]] && { skip=${1#skip=}; shift; }
	awk -v skip="$skip" '/sqdisc_spdk stats:/ && ++seen > skip { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[2] != "") s[kv[1]] += kv[2] } n++ }
	END { if (n) printf "%dqp/%dwr/m%d/s%d/b%d/x%d/l%d/f%d+%d/o%d/e%d/d%d/u%d", n, s["accepted"], s["markers"], s["mod_signals"], s["backlogged"], s["stray"], s["late"],
		s["send_flushes"], s["recv_flushes"], s["owed_flushes"], s["other_errors"], s["duplicates"], s["unhanded"]; else printf "-" }' "$@" 2>/dev/null
}

# The device's side, for either provider: the completions the process polled from the sim with
# IBV_WC_WR_FLUSH_ERR and with another error status, summed over its QPs (the preload library's lines when
# SQDISC_SIM_QP_STATS=1, one per QP destroyed): F<flushes>/E<other errors>.
sim_counters() { # [skip=N] file
	local skip=0; [[ $1 == skip=* ]] && { skip=${1#skip=}; shift; }
	awk -v skip="$skip" '/sqdisc-sim qp stats:/ && ++seen > skip { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[2] != "") s[kv[1]] += kv[2] } n++ }
	END { if (n) printf "F%d/E%d", s["flush_cqes"], s["error_cqes"]; else printf "-" }' "$@" 2>/dev/null
}

ROWS=()
FAILED=0
declare -A IOPS   # transport|workload|mode -> the IOPS of its runs, in order (PAIRED=1)
row() { ROWS+=("$(printf '%-7s %-6s %-26s %10s %6s %6s %s' "$@")"); printf '%-7s %-6s %-26s %10s %6s %6s %s\n' "$@" >&2; }

host() { # mode log program args...: runs an SPDK host program of mode; prints its exit status
	local mode=$1 log=$2; shift 2
	local rc=0
	# timeout itself is no SPDK program: the preloads go to the program only.
	timeout -k 5 "$RUN_LIMIT" env LD_PRELOAD="$(preload_for "$mode")" SQDISC_SPDK_STATS=1 SQDISC_SIM_QP_STATS=1 "$@" > "$log" 2>&1 || rc=$?
	[[ $rc == 124 || $rc == 137 ]] && rc=timeout
	echo "$rc"
}

bdevperf_json() { # [reconnect]: the host reconnects after a controller failure, for 30 s
	local extra=""
	[[ ${1:-} == reconnect ]] && extra=', "ctrlr_loss_timeout_sec": 30, "reconnect_delay_sec": 1'
	cat > "$RUN/bdevperf.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [{"method": "bdev_nvme_attach_controller",
  "params": {"name": "Nvme0", "trtype": "RDMA", "adrfam": "IPv4", "traddr": "127.0.0.1",
             "trsvcid": "4420", "subnqn": "$NQN"$extra}}]}]}
EOF
}

want() { [[ -z $ONLY ]] || [[ $1 =~ $ONLY ]]; }

runs=()
want "identify" && runs+=("identify")
for o in 4 128; do want "perf randrw ${o}k" && runs+=("perf randrw ${o}k"); done
for o in $SIZES; do for q in $QDS; do want "verify ${o}k qd$q" && runs+=("verify ${o}k qd$q"); done; done
want "host killed" && runs+=("host killed")
want "qp fatal" && runs+=("qp fatal")

# One workload ($name) against the running target of $mode and $tr.
one_run() {
	log=$RUN/$tag-${name// /-}.log
	tstats_before=$(grep -c 'sqdisc_spdk stats:' "$TLOG" || true)
	tsim_before=$(grep -c 'sqdisc-sim qp stats:' "$TLOG" || true)
	case $name in
	identify)
		rc=$(host "$mode" "$log" "$SPDK/build/bin/spdk_nvme_identify" --no-huge -s 1024 -r "$TRID subnqn:$NQN")
		iops=-; fails=-;;
	perf*)
		o=${name##* }; o=${o%k}
		rc=$(host "$mode" "$log" "$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 1024 -c 0x2 -r "$TRID subnqn:$NQN" \
			-q 32 -o $((o * 1024)) -w randrw -M 50 -t "$TIME")
		iops=$(awk '/^Total/ { print int($3) }' "$log"); fails=-;;
	"host killed")
		# A host killed (SIGKILL) in the middle of a verify run: the target cleans its qpairs up and
		# serves the next host, whose verify run (4 KiB, qd 32) is this row.
		o=4; q=32
		bdevperf_json
		env LD_PRELOAD="$(preload_for "$mode")" "$SPDK/build/examples/bdevperf" --disable-cpumask-locks --no-huge -s 1024 -m 0x2 \
			-r "$RUN/bdevperf.sock" --json "$RUN/bdevperf.json" -q 32 -o 4096 -w verify -t 60 > "$log.killed" 2>&1 &
		kpid=$!   # env executes bdevperf in place: this is bdevperf
		sleep "$TIME"
		kill -KILL "$kpid" 2>/dev/null || true; wait "$kpid" 2>/dev/null || true
		rm -f "$RUN/bdevperf.sock"
		sleep 1
		;;&
	"qp fatal")
		# The host's QPs made fatal by the device in the middle of a verify run (4 KiB, qd 32): SPDK's
		# host resets the controller and reconnects (the controller is attached with a reconnect
		# delay), and the run must end with no failed I/O and no data error.
		o=4; q=32
		bdevperf_json reconnect
		env LD_PRELOAD="$(preload_for "$mode")" SQDISC_SPDK_STATS=1 SQDISC_SIM_QP_STATS=1 "$SPDK/build/examples/bdevperf" --disable-cpumask-locks --no-huge -s 1024 -m 0x2 \
			-r "$RUN/bdevperf.sock" --json "$RUN/bdevperf.json" -q 32 -o 4096 -w verify -t $((TIME + 6)) > "$log" 2>&1 &
		hpid=$!   # env executes bdevperf in place
		( sleep "$RUN_LIMIT"; kill -KILL "$hpid" 2>/dev/null ) & wdog=$!
		sleep $((TIME / 2 + 3))
		"$SIM" fail-qps --pid "$hpid" --max 64 > "$log.fault" 2>&1 || true
		rc=0; wait "$hpid" || rc=$?
		kill "$wdog" 2>/dev/null || true; wait "$wdog" 2>/dev/null || true
		[[ $rc == 137 ]] && rc=timeout
		grep -q 'made fatal' "$log.fault" || rc="$rc(no fault)"
		;;&
	verify*|"host killed")
		[[ $name == verify* ]] && { set -- $name; o=${2%k}; q=${3#qd}; }
		bdevperf_json
		rc=$(host "$mode" "$log" "$SPDK/build/examples/bdevperf" --disable-cpumask-locks --no-huge -s 1024 -m 0x2 -r "$RUN/bdevperf.sock" \
			--json "$RUN/bdevperf.json" -q "$q" -o $((o * 1024)) -w verify -t "$TIME")
		;;&
	verify*|"host killed"|"qp fatal")
		# bdevperf redraws its progress line with carriage returns.
		iops=$(tr '\r' '\n' < "$log" | awk '/^ *Total *:/ { print int($3) }' | tail -1)
		fails=$(grep -ciE 'miscompare|mismatch|Failed to verify' "$log" || true)
		fr=$(tr '\r' '\n' < "$log" | awk '/^ *Total *:/ { print $5 }' | tail -1)
		[[ -n $fr && $fr != 0.00 ]] && fails="$fails+$fr/s";;
	esac
	sleep 0.5   # the target destroys the host's qpairs as it disconnects
	ctr="host $(sqd_counters "$log"), target $(sqd_counters skip="$tstats_before" "$TLOG"); "
	[[ $mode == sqdisc ]] || ctr=
	ctr="${ctr}device: host $(sim_counters "$log"), target $(sim_counters skip="$tsim_before" "$TLOG")"
	row "$mode" "$tr" "$name" "${iops:--}" "$fails" "$rc" "$ctr"
	if [[ $rc != 0 || ( $fails != - && $fails != 0 ) ]]; then
		FAILED=1
		# A failed run can leave the target wedged: the next runs get a fresh target and device.
		if kill -0 "$TPID" 2>/dev/null; then
			"${RPC[@]}" -s "$RUN/tgt.sock" -t 2 nvmf_get_stats > "$log.tgt-stats.json" 2>&1 || true
		fi
		target_stop; cp "$TLOG" "$log.nvmf_tgt.log"
		row "$mode" "$tr" "(target after failure)" - - "$ST" -
		target_start "$mode" "$tr"
	fi
}

if [[ ${PAIRED:-0} == 1 ]]; then
	# Each workload with each provider in turn, each on a fresh target and device: the providers' IOPS are
	# measured minutes apart at most, for a machine whose load changes.
	# One run's IOPS is spread by tens of per cent by the scheduling of three processes on few cores: REPEAT
	# pairs, in alternating order so that neither provider always runs second, give a median.
	for tr in $TRANSPORTS; do
		for name in "${runs[@]}"; do
			for rep in $(seq "${REPEAT:-1}"); do
				order=$MODES
				(( rep % 2 == 0 )) && order=$(printf '%s\n' $MODES | tac | xargs)
				for mode in $order; do
					target_start "$mode" "$tr"
					tag=$mode-$tr
					one_run
					target_stop
					IOPS["$tr|$name|$mode"]+="${IOPS["$tr|$name|$mode"]:+ }${iops:--}"
					[[ $ST == 0 ]] || { FAILED=1; row "$mode" "$tr" "(target shutdown)" - - "$ST" -; }
				done
			done
		done
	done
else
	for mode in $MODES; do
		for tr in $TRANSPORTS; do
			target_start "$mode" "$tr"
			tag=$mode-$tr
			for name in "${runs[@]}"; do one_run; done
			target_stop
			ctr=; [[ $mode == sqdisc ]] && ctr="target $(sqd_counters "$TLOG"); "
			ctr="${ctr}device: target $(sim_counters "$TLOG")"
			row "$mode" "$tr" "target shutdown" - - "$ST" "$ctr"
			[[ $ST == 0 ]] || FAILED=1
		done
	done
fi
"$SIM" stop >/dev/null 2>&1 || true

echo
echo "SPDK $(spdk_version "$SPDK") ($SPDK), provider $PROVIDER; sim settings: ${SIM_ARGS:-defaults}; $TIME s per run"
printf '%-7s %-6s %-26s %10s %6s %6s %s\n' provider rdma workload IOPS verify exit "counters: sqdisc's (qpairs/WRs/markers m/moderation signals s/backlogged b/stray CQEs x/late CQEs l/flushes handed from the device f sends+receives/own flushes handed o/other errors handed e/duplicates d/owed, never handed u); the device's (flush CQEs polled F/other error CQEs polled E)"
printf '%s\n' "${ROWS[@]}"
# With PAIRED=1 and two providers: libsqdisc_spdk's IOPS over SPDK's provider's, pair by pair, and the median.
read -r -a modes <<< "$MODES"
if [[ ${PAIRED:-0} == 1 && ${#modes[@]} == 2 ]]; then
	echo
	echo "| RDMA transport | workload | ${modes[0]} IOPS | ${modes[1]} IOPS | ratios ${modes[1]}/${modes[0]} | median ratio |"
	echo "|---|---|---|---|---|---:|"
	for tr in $TRANSPORTS; do
		for name in "${runs[@]}"; do
			a=${IOPS["$tr|$name|${modes[0]}"]:-}; b=${IOPS["$tr|$name|${modes[1]}"]:-}
			[[ $a == *[0-9]* ]] || continue
			awk -v tr="$tr" -v name="$name" -v a="$a" -v b="$b" 'BEGIN {
				na = split(a, x, " "); split(b, y, " "); n = 0
				for (i = 1; i <= na; i++) if (x[i] > 0 && y[i] > 0) r[++n] = y[i] / x[i]
				for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
				rs = ""; for (i = 1; i <= na; i++) rs = rs (i > 1 ? " / " : "") (x[i] > 0 && y[i] > 0 ? sprintf("%.2f", y[i] / x[i]) : "-")
				med = n == 0 ? "-" : sprintf("%.2f", n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2)
				gsub(" ", " / ", a); gsub(" ", " / ", b)
				printf "| %s | %s | %s | %s | %s | %s |\n", tr == "nosrq" ? "--no-srq" : "SRQ", name, a, b, rs, med }'
		done
	done
fi
exit "$FAILED"
