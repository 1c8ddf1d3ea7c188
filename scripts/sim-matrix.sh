#!/usr/bin/env bash
# Unmodified verbs programs on the software HCA's device daemon: each case runs a server and a client, two
# processes, through `sqdisc-sim run` on a private daemon (its own socket, started and stopped here), with the
# program's own data check on where it has one (`-c` of the pingpongs). The whole matrix runs three ways:
#   plain     a daemon with no loss
#   loss      a fresh daemon losing requests and responses (--loss-ppm/--ack-loss-ppm $SIM_MATRIX_LOSS_PPM)
#   checker   no loss, libsqdisc_check.so preloaded first (the sim's preload last, as `sqdisc-sim run` puts it)
# A case passes only when both processes exit 0 within the time limit AND neither printed a failure text of its
# own ("invalid data", "Failed status", "Couldn't ...": the pingpongs can print those and still exit 0), nor
# the preload a failed call ("sqdisc-sim: ..."), nor (checker) the checker a violation or no report at all.
# The connection manager's programs (rping -V, ucmatose, rdma_server/rdma_client, perftest -R, qperf's rc tests)
# run the same way. One row per case; exits 1 if any case failed.
#
# Some outcomes are KNOWN, not failures, each recognised by its exact signature and listed at the end:
# - loss mode, ibv_*_pingpong: one side finished, the other failed its last SEND with "transport retry counter
#   exceeded". The programs have no closing handshake: a side that has everything destroys its QPs and exits
#   while the ACK of the peer's last SEND, sent as the QP was destroyed, may be lost; the peer's
#   retransmissions then find no QP. A real HCA on a lossy fabric fails the same way. perftest -R's closing
#   exchange has the same race ("Bad wc status 12", then "Unable to write ... socket/rdma_cm").
# - checker mode, ib_{write,read,atomic}_{lat,bw}: perftest gives the QP of a one-sided test a one-slot RQ it
#   never posts to and makes it share the send CQ, sized for the SQ alone; the checker's CQ-sizing rule counts
#   every SQ and RQ slot, so it reports "CQ undersized" (N send + 1 receive slots on N CQEs), once per process.
#   qperf's rc tests share their CQ the same way and get the same finding.
#   Any other finding fails the case.
# - perftest with -R (librdmacm): the last messages of its closing exchange (wr_id 5) reuse their buffer before
#   the SEND that carries it has completed. The checker reports "source modified while in flight" (checker
#   mode), and under loss a retransmission of such a SEND reads the new bytes, which the daemon logs as the same
#   violation (the daemon report row, loss mode). Both are the program's own discipline bug, found twice.
# qperf's tests run twice: polling (-cp 1) and in its event mode (rows "-e"), which ends each test with a
# SIGALRM that interrupts its wait in ibv_get_cq_event.
# - perftest with -R connects twice: its exchange QPs, then its test QPs, on the same port, the server
#   listening again after the first exchange. A client that resolves and connects faster than the server
#   listens is REJECTED; perftest 4.5-0.17 (Debian 12) then retries with the identifiers it has just destroyed
#   and gives up (later perftest releases make new ones). Recognised by perftest's "Event:
#   RDMA_CM_EVENT_REJECTED" after its first connection; rare, and more likely on a loaded machine.
#   A client is started again only when its server accepted nothing yet: started again after a later
#   rejection, its first connection would reach the server's second listener.
#
# usage: sim-matrix.sh DIR [MODE...]    DIR holds bin/sqdisc-sim, lib/libsqdisc_sim_preload.so and
#                                      lib/libsqdisc_check.so: build/ or a staged install's usr/ (make sim-matrix);
#                                      MODE: plain loss checker, default all three
#   SIM_MATRIX_PORT       first TCP port of the out-of-band exchange (default: 19000 + a slice by process id)
#   SIM_MATRIX_LOSS_PPM   the loss mode's request and response loss, per million (default 20000)
#   SIM_MATRIX_TIMEOUT    seconds each process may take (default 40)
#   SIM_MATRIX_ONLY       run only the cases whose name contains this text
#   SIM_MATRIX_KEEP       a directory to keep every case's output in (default: a temporary one, removed)
set -uo pipefail

build=${1:?usage: sim-matrix.sh DIR [plain|loss|checker...]}
shift
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(plain loss checker)
build=$(cd "$build" && pwd)
sim=$build/bin/sqdisc-sim
preload=$build/lib/libsqdisc_sim_preload.so
checker=$build/lib/libsqdisc_check.so
for f in "$sim" "$preload"; do
    [ -e "$f" ] || { echo "sim-matrix: $f is missing (make stage; or give build/ after make simdev)" >&2; exit 2; }
done
for m in "${modes[@]}"; do
    case $m in
    plain | loss) ;;
    checker) [ -e "$checker" ] || { echo "sim-matrix: $checker is missing (make check-lib)" >&2; exit 2; } ;;
    *) echo "sim-matrix: unknown mode $m" >&2; exit 2 ;;
    esac
done
for p in ibv_devinfo ibv_rc_pingpong ibv_srq_pingpong ib_send_lat ib_write_bw rping ucmatose rdma_server rdma_client qperf ss timeout; do
    command -v "$p" > /dev/null || { echo "sim-matrix: $p is not installed (scripts/install-deps.sh check)" >&2; exit 2; }
done

loss_ppm=${SIM_MATRIX_LOSS_PPM:-20000}
limit=${SIM_MATRIX_TIMEOUT:-40}
port=${SIM_MATRIX_PORT:-$((19000 + ($$ % 90) * 100))}
if [ -n "${SIM_MATRIX_KEEP:-}" ]; then
    work=$SIM_MATRIX_KEEP
    mkdir -p "$work"
else
    work=$(mktemp -d /tmp/sqdisc-sim-matrix.XXXXXX)
fi
socket=$work/daemon/socket
# The preload is found as an installed sqdisc-sim finds it: beside it, or in ../lib.
export SQDISC_SIM_SOCKET=$socket SQDISC_SIM_PRELOAD=
unset LD_PRELOAD

stop_daemon() {
    [ -S "$socket" ] && timeout 15 "$sim" stop > /dev/null 2>&1
    # A daemon that did not answer: its pid is in the lock file.
    local pid
    pid=$(cat "$socket.lock" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
    return 0
}
cleanup() {
    local pids
    pids=$(jobs -p)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
    stop_daemon
    [ -n "${SIM_MATRIX_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_daemon() { # settings...
    stop_daemon
    rm -rf "$work/daemon"
    if ! timeout 15 "$sim" start --seed 7 "$@" > "$work/start.log" 2>&1; then
        sed 's/^/    | /' "$work/start.log" "$socket.log" 2>/dev/null
        echo "sim-matrix: the daemon did not start" >&2
        exit 1
    fi
}

# What a case's output must not contain: the programs' own failure texts, and the preload's messages (a verbs
# call that failed inside it). Warnings of perftest about the CPU frequency are not failures.
failure_re='invalid data|Failed status|parse WC failed|[Cc]ouldn.t|[Ff]ailed|[Ee]rror|ERROR|Unable|[Uu]nsupported|not supported|sqdisc-sim:|Segmentation|Aborted|panicked'

passed=0 failed=0 known=0
failures=() knowns=()
printf '%-36s %-8s %-8s %-6s %s\n' case loss checker result figure
printf '%-36s %-8s %-8s %-6s %s\n' ---- ---- ------- ------ ------

# row NAME LOSS CHECK RESULT FIGURE
row() {
    printf '%-36s %-8s %-8s %-6s %s\n' "$1" "$2" "$3" "$4" "$5"
    case $4 in
    PASS) passed=$((passed + 1)) ;;
    KNOWN) known=$((known + 1)); knowns+=("$1 ($2, checker $3): $5") ;;
    *) failed=$((failed + 1)); failures+=("$1 ($2, checker $3): $5") ;;
    esac
}

# The environment of one process: the checker first, reporting to a file per process.
run_env() { # dir
    if [ "$mode" = checker ]; then
        echo "LD_PRELOAD=$checker SQDISC_CHECK_REPORT=$1/check.%p SQDISC_CHECK_SAMPLE=1"
    fi
}

# What the checker finds in an unmodified program and is known (see the top), as a regex: the shared CQ of
# perftest's one-sided tests and of qperf; and, with -R (librdmacm), perftest's reuse of the buffer of its
# closing exchange (wr_id 5) before that SEND's completion. known_finding PROGRAM [rdmacm]
shared_cq='CQ undersized: cq 0x[0-9a-f]+ holds ([0-9]+) CQEs but its QPs can have [0-9]+ outstanding .* once qp 0x[0-9a-f]+ \(\1 send, 1 receive slots\) uses it'
perftest_reuse='source modified while in flight: the source of send WQE #[0-9]+ \(wr_id 0x5\) of qp 0x[0-9a-f]+ changed between its post and the CQE that covers it'
shared_cq_finding() { # program [rdmacm]
    local re=
    case $1 in
    ib_write_* | ib_read_* | ib_atomic_* | qperf) re=$shared_cq ;;
    esac
    if [ "${2:-}" = rdmacm ] && [[ $1 == ib_* ]]; then re=${re:+$re|}$perftest_reuse; fi
    echo "$re"
}

# The pingpongs' exit race under ACK loss (see the top), recognised exactly: one side exited 0 having printed
# its result, the other exited 1 after "transport retry counter exceeded" of its SEND (wr_id 2 in both
# programs; ibv_rc_pingpong adds "parse WC failed"), and nothing else failed. Prints the row's text when it is that.
pingpong_exit_race() { # dir server-rc client-rc
    local ok bad
    if [ "$2" -eq 0 ] && [ "$3" -eq 1 ]; then ok=$1/server.out bad=$1/client.out
    elif [ "$2" -eq 1 ] && [ "$3" -eq 0 ]; then ok=$1/client.out bad=$1/server.out
    else return 1; fi
    grep -q -E '[0-9]+ iters in [0-9.]+ seconds' "$ok" || return 1
    ! grep -q -E -- "$failure_re" "$ok" || return 1
    # The failure line, and ibv_rc_pingpong's "parse WC failed N" after it; nothing else.
    grep -q -E '^Failed status transport retry counter exceeded \(12\) for wr_id 2$' "$bad" || return 1
    ! grep -E -- "$failure_re" "$bad" | grep -v -q -E '^(Failed status transport retry counter exceeded \(12\) for wr_id 2|parse WC failed [0-9]+)$' || return 1
    echo "exit race: the $(basename "$ok" .out) finished and destroyed its QPs, the ACK of the $(basename "$bad" .out)'s last SEND was lost, its retries found no QP (RETRY_EXC_ERR)"
}

# The same race at the end of perftest -R's closing exchange (loss mode): one side finished, the other's last
# exchange SEND ended in RETRY_EXC_ERR ("Bad wc status 12") because the finished side had destroyed its QPs.
# perftest_exit_race DIR SERVER-RC CLIENT-RC
perftest_exit_race() {
    local ok bad
    if [ "$2" -eq 0 ] && [ "$3" -eq 1 ]; then ok=$1/server.out bad=$1/client.out
    elif [ "$2" -eq 1 ] && [ "$3" -eq 0 ]; then ok=$1/client.out bad=$1/server.out
    else return 1; fi
    ! grep -q -E -- "$failure_re" "$ok" || return 1
    grep -q -E '(^| )Bad wc status 12$' "$bad" || return 1
    ! grep -E -- "$failure_re" "$bad" | grep -v -q -E '^ *(Unable to write (to|from) socket/rdma_cm|Failed to close connection between server and client|Failed to exchange data between server and clients)$' || return 1
    echo "exit race: the $(basename "$ok" .out) finished and destroyed its QPs, the ACK of the $(basename "$bad" .out)'s last exchange SEND was lost, its retries found no QP (RETRY_EXC_ERR)"
}

# Why a case's output counts as failed, or nothing. output_failure DIR PROCESSES [REGEX [ALLOWED-FINDING]]
output_failure() {
    local f line re=${3:-$failure_re}
    for f in "$1"/server.out "$1"/client.out; do
        [ -e "$f" ] || continue
        line=$(grep -E -- "$re" "$f" | grep -v -i 'warning' | head -n 1 || true)
        if [ -n "$line" ]; then echo "$(basename "$f" .out): $line"; return; fi
    done
    if [ "$mode" = checker ]; then
        local reports=("$1"/check.*)
        if [ "$2" -gt 0 ] && { [ ! -e "${reports[0]}" ] || [ ${#reports[@]} -lt "$2" ]; }; then
            echo "the checker wrote ${#reports[@]} report(s) for $2 process(es) (a crash?)"; return
        fi
        local n findings expected known_text= known_reports=0
        for f in "${reports[@]}"; do
            [ -e "$f" ] || continue
            line=$(grep -m1 '^sqdisc-check report' "$f" || true)
            case $line in
            *': 0 violations') continue ;;
            '') echo "checker: $(basename "$f") has no report line"; return ;;
            esac
            n=${line##*: }
            n=${n%% *}
            # The findings (notices excluded), and how many of them are perftest's shared CQ (the header).
            findings=$(sed -n 's/^  \[.*\] //p' "$f" | grep -v 'flush of an unsignaled WQE' || true)
            expected=0
            if [ -n "${4:-}" ]; then
                expected=$(grep -c -E "$4" <<< "$findings" || true)
            fi
            if [ "$n" -ne "$expected" ] || [ "$expected" -ne "$(grep -c . <<< "$findings")" ]; then
                echo "checker: ${line#sqdisc-check report }: $(grep -v -E "${4:-^$}" <<< "$findings" | head -n 1)"
                return
            fi
            if grep -q 'CQ undersized' <<< "$findings"; then
                known_text="checker: $(grep -o -m1 'CQ undersized: cq 0x[0-9a-f]* holds [0-9]* CQEs' <<< "$findings" | sed 's/cq 0x[0-9a-f]* //') for $(grep -o -m1 '([0-9]* send, 1 receive slots)' <<< "$findings")"
            else
                known_text="checker"
            fi
            if grep -q 'wr_id 0x5' <<< "$findings"; then
                known_text="$known_text; the closing exchange's buffer reused before its SEND completed ($(grep -c 'wr_id 0x5' <<< "$findings") WQE(s))"
            fi
            known_text="$known_text, in $(( ++known_reports )) of ${#reports[@]} reports"
        done
        [ -z "$known_text" ] || echo "KNOWN $known_text"
    fi
}

# The client's key figure: the pingpongs' rate line, perftest's average bandwidth or latency.
figure() { # dir program
    local out=$1/client.out
    case $2 in
    ibv_*pingpong)
        grep -E -o '[0-9.]+ Mbit/sec' "$out" | head -n 1 | tr '\n' ' '
        grep -E -o '[0-9.]+ usec/iter' "$out" | head -n 1 ;;
    *_bw) awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ { print "BW avg " $4 " MB/s, " $2 " iters"; exit }' "$out" ;;
    *_lat) awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ { print "t_avg " $6 " us, " $2 " iters"; exit }' "$out" ;;
    esac
}

# A two-process case: the server, then the client when the server listens on its TCP port (the pingpongs' and
# perftest's out-of-band exchange). pair NAME PROGRAM ARGS...
pair() {
    local name=$1 prog=$2; shift 2
    [ -z "${SIM_MATRIX_ONLY:-}" ] || [[ $name == *"$SIM_MATRIX_ONLY"* ]] || return 0
    local dir=$work/$mode/$name
    mkdir -p "$dir"
    port=$((port + 1))
    # A port some other program listens on (a concurrent run elsewhere) is skipped.
    while ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do port=$((port + 1)); done
    local env
    env=$(run_env "$dir")
    # shellcheck disable=SC2086
    env $env timeout -k 2 "$limit" "$sim" run -- "$prog" "$@" -p "$port" > "$dir/server.out" 2>&1 &
    local server=$!
    local waited=0
    while ! ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do
        if ! kill -0 "$server" 2>/dev/null || [ $waited -ge 1000 ]; then break; fi
        sleep 0.01
        waited=$((waited + 1))
    done
    local crc=0 src=0
    # shellcheck disable=SC2086
    env $env timeout -k 2 "$limit" "$sim" run -- "$prog" "$@" -p "$port" 127.0.0.1 > "$dir/client.out" 2>&1 || crc=$?
    wait "$server" || src=$?
    local why
    if [ "$mode" = loss ] && [[ $prog == ibv_*pingpong ]] && why=$(pingpong_exit_race "$dir" $src $crc); then
        row "$name" "$loss" "$check" KNOWN "$why"
    elif [ $src -ne 0 ] || [ $crc -ne 0 ]; then
        why="exit server $src client $crc"
        [ $src -ne 124 ] && [ $crc -ne 124 ] || why="$why (124: timed out after ${limit}s)"
        local line
        line=$(cat "$dir/client.out" "$dir/server.out" | grep -E -m1 -- "$failure_re" || true)
        [ -z "$line" ] || why="$why: $line"
        row "$name" "$loss" "$check" FAIL "$why"
    elif why=$(output_failure "$dir" 2 "" "$(shared_cq_finding "$prog")") && [ -n "$why" ]; then
        case $why in
        KNOWN*) row "$name" "$loss" "$check" KNOWN "${why#KNOWN }; $(figure "$dir" "$prog")" ;;
        *) row "$name" "$loss" "$check" FAIL "$why" ;;
        esac
    else
        row "$name" "$loss" "$check" PASS "$(figure "$dir" "$prog")"
    fi
}

single() { # NAME CHECK-REGEX... -- PROGRAM ARGS...
    local name=$1; shift
    local musts=()
    while [ "$1" != -- ]; do musts+=("$1"); shift; done
    shift
    [ -z "${SIM_MATRIX_ONLY:-}" ] || [[ $name == *"$SIM_MATRIX_ONLY"* ]] || return 0
    local dir=$work/$mode/$name
    mkdir -p "$dir"
    local env rc=0 why m
    env=$(run_env "$dir")
    # shellcheck disable=SC2086
    env $env timeout -k 2 "$limit" "$sim" run -- "$@" > "$dir/client.out" 2>&1 || rc=$?
    if [ $rc -ne 0 ]; then
        row "$name" "$loss" "$check" FAIL "exit $rc: $(head -n 1 "$dir/client.out")"; return
    fi
    for m in "${musts[@]}"; do
        if ! grep -q -E -- "$m" "$dir/client.out"; then row "$name" "$loss" "$check" FAIL "no /$m/ in the output"; return; fi
    done
    # ibv_devinfo makes no QP or CQ: the checker attaches nothing and writes no report, which is fine. Its -v
    # output says "... not supported" of device capabilities by design: only its failure texts count.
    if why=$(output_failure "$dir" 0 'Failed|[Cc]ouldn.t|[Ee]rror|sqdisc-sim:|Segmentation|Aborted|panicked') && [ -n "$why" ]; then row "$name" "$loss" "$check" FAIL "$why"; return; fi
    row "$name" "$loss" "$check" PASS "$(grep -c -E 'hca_id|port:' "$dir/client.out") device/port lines"
}

# A two-process case that connects through librdmacm: no TCP port to watch, so the client starts once the
# server has printed READY (a regex; empty: once the server is a client of the daemon, and a moment more) and is
# started again if it was rejected because the server did not listen yet. @PORT@ in the arguments is the port.
# cm_pair NAME READY SERVER ARGS... -- CLIENT ARGS...
cm_pair() {
    local name=$1 ready=$2; shift 2
    local server_args=() client_args=()
    while [ "$1" != -- ]; do server_args+=("${1//@PORT@/$((port + 1))}"); shift; done
    shift
    while [ $# -gt 0 ]; do client_args+=("${1//@PORT@/$((port + 1))}"); shift; done
    port=$((port + 1))
    [ -z "${SIM_MATRIX_ONLY:-}" ] || [[ $name == *"$SIM_MATRIX_ONLY"* ]] || return 0
    local dir=$work/$mode/$name
    mkdir -p "$dir"
    local env
    env=$(run_env "$dir")
    # shellcheck disable=SC2086
    env $env timeout -k 2 "$limit" "$sim" run -- "${server_args[@]}" > "$dir/server.out" 2>&1 &
    local server=$! waited=0
    while kill -0 "$server" 2>/dev/null && [ $waited -lt 1000 ]; do
        if [ -n "$ready" ]; then
            grep -s -q -E -- "$ready" "$dir/server.out" && break
        elif "$sim" status 2>/dev/null | grep -q " ${server_args[0]}:"; then
            sleep 0.3
            break
        fi
        sleep 0.01
        waited=$((waited + 1))
    done
    local crc=0 src=0 try
    for try in 1 2 3 4 5; do
        crc=0
        # shellcheck disable=SC2086
        env $env timeout -k 2 "$limit" "$sim" run -- "${client_args[@]}" > "$dir/client.out" 2>&1 || crc=$?
        [ $crc -ne 0 ] && grep -q -E 'REJECTED|rejected|Connection refused' "$dir/client.out" || break
        # Started again only if the server accepted nothing yet (it was not listening): a client rejected
        # later, on a second connection of its own, is a finding; started again, it would connect to that
        # second listener.
        "$sim" status 2>/dev/null | grep -E " ${server_args[0]}: [1-9][0-9]* QP" > /dev/null && break
        sleep 0.3
    done
    # A server whose client failed may wait for it for ever: it gets a moment, then it is stopped.
    if [ $crc -ne 0 ]; then
        local grace=0
        while kill -0 "$server" 2>/dev/null && [ $grace -lt 30 ]; do sleep 0.1; grace=$((grace + 1)); done
        kill "$server" 2>/dev/null
    fi
    wait "$server" || src=$?
    local why
    if [ $crc -ne 0 ] && [[ ${server_args[0]} == ib_*_lat || ${server_args[0]} == ib_*_bw ]] \
        && grep -q 'Event: RDMA_CM_EVENT_REJECTED' "$dir/client.out"; then
        row "$name" "$loss" "$check" KNOWN "perftest's client connected its test QPs before its server listened for them (REJECTED); exit server $src client $crc"
    elif [ "$mode" = loss ] && [[ ${server_args[0]} == ib_*_lat || ${server_args[0]} == ib_*_bw ]] \
        && why=$(perftest_exit_race "$dir" $src $crc); then
        row "$name" "$loss" "$check" KNOWN "$why"
    elif [ $src -ne 0 ] || [ $crc -ne 0 ]; then
        why="exit server $src client $crc"
        [ $src -ne 124 ] && [ $crc -ne 124 ] || why="$why (124: timed out after ${limit}s)"
        local line
        line=$(cat "$dir/client.out" "$dir/server.out" | grep -E -m1 -- "$failure_re" || true)
        [ -z "$line" ] || why="$why: $line"
        row "$name" "$loss" "$check" FAIL "$why"
    elif why=$(output_failure "$dir" 2 "" "$(shared_cq_finding "${server_args[0]}" rdmacm)") && [ -n "$why" ]; then
        case $why in
        KNOWN*) row "$name" "$loss" "$check" KNOWN "${why#KNOWN }" ;;
        *) row "$name" "$loss" "$check" FAIL "$why" ;;
        esac
    else
        row "$name" "$loss" "$check" PASS "$(figure "$dir" "${client_args[0]}")"
    fi
}

# qperf: one server, several client tests against it, each a row; the server is stopped at the end.
# qperf_cases CP: 1, the tests poll the CQ; 0, they wait for completion events (qperf's default; rows "-e").
qperf_cases() {
    local cp=$1 suffix=
    [ "$cp" = 1 ] || suffix=-e
    [ -z "${SIM_MATRIX_ONLY:-}" ] || [[ qperf$suffix == *"$SIM_MATRIX_ONLY"* ]] || return 0
    port=$((port + 1))
    while ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; do port=$((port + 1)); done
    local dir=$work/$mode/qperf-server env test
    mkdir -p "$dir"
    env=$(run_env "$dir")
    # shellcheck disable=SC2086
    env $env timeout -k 2 "$limit" "$sim" run -- qperf -lp "$port" > "$dir/server.out" 2>&1 &
    local server=$! waited=0
    while ! ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && [ $waited -lt 1000 ]; do sleep 0.01; waited=$((waited + 1)); done
    for test in rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_lat rc_compare_swap_mr; do
        local name=qperf-$test$suffix
        local cdir=$work/$mode/$name rc=0 why
        mkdir -p "$cdir"
        env=$(run_env "$cdir")
        # shellcheck disable=SC2086
        env $env timeout -k 2 "$limit" "$sim" run -- qperf -lp "$port" -t 1 -cp "$cp" 127.0.0.1 "$test" > "$cdir/client.out" 2>&1 || rc=$?
        if [ $rc -ne 0 ]; then
            row "$name" "$loss" "$check" FAIL "exit $rc: $(grep -v '^ *$' "$cdir/client.out" | tail -n 1)"
        elif why=$(output_failure "$cdir" 1 "" "$(shared_cq_finding qperf)") && [ -n "$why" ]; then
            case $why in
            KNOWN*) row "$name" "$loss" "$check" KNOWN "${why#KNOWN }" ;;
            *) row "$name" "$loss" "$check" FAIL "$why" ;;
            esac
        else
            row "$name" "$loss" "$check" PASS "$(awk 'NR == 2 { $1 = $1; print }' "$cdir/client.out")"
        fi
    done
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
}

# Sizes and counts: small, so that the whole matrix stays well under three minutes; the pingpongs' data check
# compares every received byte.
matrix() {
    single devinfo 'hca_id:[[:space:]]+sqd_sim0' 'state:[[:space:]]+PORT_ACTIVE' -- ibv_devinfo -v
    pair rc_pingpong ibv_rc_pingpong -c -n 200 -s 4096
    pair rc_pingpong-e ibv_rc_pingpong -c -e -n 200 -s 4096
    pair rc_pingpong-N ibv_rc_pingpong -c -N -n 200 -s 4096
    pair srq_pingpong ibv_srq_pingpong -c -q 4 -n 50 -s 4096
    pair srq_pingpong-e ibv_srq_pingpong -c -e -q 4 -n 50 -s 4096
    local t api
    for t in send write read atomic; do
        for api in new old; do
            local extra=() suffix=
            [ $api = new ] || { extra=(--use_old_post_send); suffix=-old; }
            pair "ib_${t}_lat$suffix" "ib_${t}_lat" -d sqd_sim0 -n 200 "${extra[@]}"
            pair "ib_${t}_bw$suffix" "ib_${t}_bw" -d sqd_sim0 -n 100 "${extra[@]}"
        done
    done
    # The connection manager (librdmacm).
    cm_pair rping '' rping -s -a 127.0.0.1 -p @PORT@ -C 50 -V -- rping -c -a 127.0.0.1 -p @PORT@ -C 50 -V
    cm_pair ucmatose '' ucmatose -p @PORT@ -- ucmatose -s 127.0.0.1 -p @PORT@
    cm_pair rdma_server '' rdma_server -p @PORT@ -- rdma_client -s 127.0.0.1 -p @PORT@
    for t in send write read atomic; do
        cm_pair "ib_${t}_lat-R" '' "ib_${t}_lat" -R -n 200 -p @PORT@ -- "ib_${t}_lat" -R -n 200 -p @PORT@ 127.0.0.1
        cm_pair "ib_${t}_bw-R" '' "ib_${t}_bw" -R -n 100 -p @PORT@ -- "ib_${t}_bw" -R -n 100 -p @PORT@ 127.0.0.1
    done
    qperf_cases 1
    qperf_cases 0
}

start=$SECONDS
for mode in "${modes[@]}"; do
    case $mode in
    plain) loss=0 check=off; start_daemon ;;
    loss) loss="${loss_ppm}ppm" check=off; start_daemon --loss-ppm "$loss_ppm" --ack-loss-ppm "$loss_ppm" ;;
    checker) loss=0 check=on; start_daemon ;;
    esac
    matrix
    # The daemon's own violation log: an unmodified program that breaks the device's rules fails its mode.
    rc=0
    timeout 15 "$sim" report > "$work/$mode.report" 2>&1 || rc=$?
    if [ $rc -eq 0 ]; then
        row "daemon report" "$loss" "$check" PASS "$(head -n 1 "$work/$mode.report")"
    elif [ $rc -eq 3 ] && ! sed 1d "$work/$mode.report" | grep -v -q -E '^step [0-9]+ pid [0-9]+ \(ib_[a-z]+_(bw|lat)\) qp 0x[0-9a-f]+ wqe [0-9]+: source modified while in flight: retransmission #[0-9]+ of send WQE #[0-9]+ \(wr_id 0x5\)'; then
        row "daemon report" "$loss" "$check" KNOWN "$(head -n 1 "$work/$mode.report"), each perftest -R's closing exchange's buffer reused before its SEND completed, seen by a retransmission"
    else
        row "daemon report" "$loss" "$check" FAIL "exit $rc: $(sed -n 2p "$work/$mode.report")"
    fi
    stop_daemon
done

echo "sim-matrix: $passed passed, $known known, $failed failed in $((SECONDS - start)) s"
if [ "$known" -gt 0 ]; then
    echo "sim-matrix: known outcomes (explained at the top of scripts/sim-matrix.sh):"
    printf '  %s\n' "${knowns[@]}"
fi
if [ "$failed" -gt 0 ]; then
    echo "sim-matrix: failures:"
    printf '  %s\n' "${failures[@]}"
    echo "sim-matrix: outputs in $work (set SIM_MATRIX_KEEP=DIR to keep them)"
    exit 1
fi
