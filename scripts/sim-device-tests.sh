#!/usr/bin/env bash
# The device daemon's faults, each with programs of c-tests/sim_device/ on plain libibverbs and the preload:
#   killed-client   a client SIGKILLed in the middle of a transfer: its peer's QP fails as towards a real dead
#                   peer (RETRY_EXC_ERR, then flushes) and `sqdisc-sim status` no longer lists the dead client
#   killed-daemon   the daemon SIGKILLed under a client blocked in ibv_get_async_event: IBV_EVENT_DEVICE_FATAL,
#                   errors from posts and polls, nothing hangs
#   second-daemon   a second daemon on a socket that one serves is refused with a clear message
#   other-user      a client of another user (run as nobody) is refused, by the socket's mode and, where the
#                   socket is reachable, by the daemon itself
#   reuse-source    a program that reuses a SEND's source before its completion, in two processes under loss:
#                   `sqdisc-sim report` names the violation, the process, the program, its QP and the WQE
# Malformed and truncated messages are tested at the protocol level in simdev/daemon/tests/faults.rs.
#
# usage: sim-device-tests.sh DIR    DIR holds bin/sqdisc-sim and lib/libsqdisc_sim_preload.so (build/ or a staged
#                                   install's usr/)
set -uo pipefail

dir=${1:?usage: sim-device-tests.sh DIR}
dir=$(cd "$dir" && pwd)
sim=$dir/bin/sqdisc-sim
for f in "$sim" "$dir/lib/libsqdisc_sim_preload.so"; do
    [ -e "$f" ] || { echo "sim-device-tests: $f is missing (make stage; or give build/ after make simdev)" >&2; exit 2; }
done
root=$(cd "$(dirname "$0")/.." && pwd)
CC=${CC:-cc}
# Reachable by another user (the other-user test), each test's directory below made private or not as it needs.
work=$(mktemp -d /tmp/sqdisc-sim-device-tests.XXXXXX)
chmod 755 "$work"
unset LD_PRELOAD
export SQDISC_SIM_PRELOAD=
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
show() { sed 's/^/    | /' "$@" 2>/dev/null; }

daemons=()
cleanup() {
    local pids s
    pids=$(jobs -p)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
    for s in "${daemons[@]}"; do
        pids=$(cat "$s.lock" 2>/dev/null || true)
        [ -z "$pids" ] || kill -KILL "$pids" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for p in peer daemon_gone reuse_source; do
    if ! "$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror -g -I"$root/c-tests/sim_device" \
        "$root/c-tests/sim_device/$p.c" -o "$work/$p" -libverbs -lpthread 2> "$work/$p.cc.log"; then
        show "$work/$p.cc.log"
        echo "sim-device-tests: cannot build c-tests/sim_device/$p.c" >&2
        exit 1
    fi
done

# start_daemon SOCKET [settings...]: a daemon of this test only.
start_daemon() {
    local s=$1; shift
    daemons+=("$s")
    SQDISC_SIM_SOCKET=$s timeout 15 "$sim" start --seed 3 "$@" > "$s.start" 2>&1 || { show "$s.start"; return 1; }
}
daemon_pid() { cat "$1.lock"; }
simctl() { # SOCKET COMMAND...
    local s=$1; shift
    SQDISC_SIM_SOCKET=$s timeout 15 "$sim" "$@"
}
wait_for() { # FILE SECONDS
    local i
    for ((i = 0; i < $2 * 100; i++)); do
        [ -e "$1" ] && return 0
        sleep 0.01
    done
    return 1
}

# ---- a client killed in the middle of a transfer --------------------------------------------------------

t=$work/killed-client
mkdir -p "$t"
s=$t/socket
if start_daemon "$s"; then
    SQDISC_SIM_SOCKET=$s timeout 60 "$sim" run -- "$work/peer" survivor "$t" > "$t/survivor.out" 2>&1 &
    survivor_timeout=$!
    SQDISC_SIM_SOCKET=$s timeout 60 "$sim" run -- "$work/peer" victim "$t" > "$t/victim.out" 2>&1 &
    victim=$!
    if wait_for "$t/victim.busy" 20; then
        simctl "$s" status > "$t/status.before" 2>&1
        # $victim is the timeout command's; the program's own pid is in the file.
        victim_timeout=$victim
        victim=$(cat "$t/victim.busy")
        survivor=$(sed -n 's/^survivor: pid \([0-9]*\) .*/\1/p' "$t/survivor.out")
        kill -KILL "$victim"
        wait "$victim_timeout" 2>/dev/null
        if wait_for "$t/survivor.checked" 30; then
            simctl "$s" status > "$t/status.after" 2>&1
            touch "$t/survivor.release"
        fi
        rc=0
        wait "$survivor_timeout" || rc=$?
        if [ $rc -eq 0 ] && grep -q 'RETRY_EXC_ERR for wr_id' "$t/survivor.out" \
            && grep -q 'later WRs flushed' "$t/survivor.out" && grep -q 'posted afterwards flushed' "$t/survivor.out"; then
            pass "killed-client: the peer's QP failed as towards a dead peer: $(grep -o '[0-9]* SENDs completed, then RETRY_EXC_ERR.*' "$t/survivor.out"), $(grep -o '[0-9]* later WRs flushed' "$t/survivor.out")"
        else
            show "$t/survivor.out" "$t/victim.out"
            fail "killed-client: the survivor exited $rc"
        fi
        # Before the kill both clients were listed; after it, the survivor only, with its QP.
        if grep -q "pid $victim peer: 1 QP(s)" "$t/status.before" && grep -q "pid $survivor peer: 1 QP(s)" "$t/status.before" \
            && [ -e "$t/status.after" ] && ! grep -q "pid $victim " "$t/status.after" \
            && grep -q "pid $survivor peer: 1 QP(s), 1 CQ(s), 1 MR(s)" "$t/status.after" && grep -q '^1 client process' "$t/status.after"; then
            pass "killed-client: sqdisc-sim status listed pid $victim before the kill and not after (its QP, CQ and MR destroyed)"
        else
            show "$t/status.before" "$t/status.after"
            fail "killed-client: the status does not show the dead client's objects gone"
        fi
    else
        show "$t/victim.out" "$t/survivor.out"
        fail "killed-client: the transfer did not start"
    fi
    simctl "$s" stop > /dev/null 2>&1
else
    fail "killed-client: no daemon"
fi

# ---- the daemon killed under a client ---------------------------------------------------------------------

t=$work/killed-daemon
mkdir -p "$t"
s=$t/socket
if start_daemon "$s"; then
    pid=$(daemon_pid "$s")
    SQDISC_SIM_SOCKET=$s timeout 30 "$sim" run -- "$work/daemon_gone" "$t" > "$t/out" 2>&1 &
    client=$!
    if wait_for "$t/ready" 20; then
        sleep 0.3 # into ibv_get_async_event
        kill -KILL "$pid"
        rc=0
        wait "$client" || rc=$?
        if [ $rc -eq 0 ] && grep -q 'daemon_gone: PASS' "$t/out" && grep -q 'ibv_get_async_event: local catastrophic error' "$t/out"; then
            pass "killed-daemon: ibv_get_async_event gave IBV_EVENT_DEVICE_FATAL, ibv_get_cq_event -1; posts, polls and notify fail; teardown succeeds; nothing hangs"
        else
            show "$t/out"
            fail "killed-daemon: the client exited $rc$([ $rc -eq 124 ] && echo ' (hung: timed out)')"
        fi
    else
        show "$t/out"
        fail "killed-daemon: the client did not get ready"
    fi
    # The dead daemon left its socket file behind: the next `run` starts a new daemon there.
    rc=0
    SQDISC_SIM_SOCKET=$s timeout 20 "$sim" run -- ibv_devinfo > "$t/devinfo" 2>&1 || rc=$?
    if [ $rc -eq 0 ] && grep -q 'hca_id:[[:space:]]*sqd_sim0' "$t/devinfo" && [ "$(daemon_pid "$s")" != "$pid" ]; then
        pass "killed-daemon: the next sqdisc-sim run started a new daemon (pid $(daemon_pid "$s")) on the dead one's socket"
    else
        show "$t/devinfo" "$s.log"
        fail "killed-daemon: no new daemon on the dead one's socket (run exited $rc)"
    fi
    simctl "$s" stop > /dev/null 2>&1
else
    fail "killed-daemon: no daemon"
fi

# ---- a second daemon on the same socket -------------------------------------------------------------------

t=$work/second-daemon
mkdir -p "$t"
s=$t/socket
if start_daemon "$s"; then
    pid=$(daemon_pid "$s")
    rc=0
    SQDISC_SIM_SOCKET=$s timeout 15 "$sim" start > "$t/start2" 2>&1 || rc=$?
    rc2=0
    SQDISC_SIM_SOCKET=$s timeout 15 "$sim" daemon > "$t/daemon2" 2>&1 || rc2=$?
    if [ $rc -ne 0 ] && grep -q "a daemon already serves $s (pid $pid)" "$t/start2" \
        && [ $rc2 -ne 0 ] && grep -q "a daemon already serves $s (pid $pid)" "$t/daemon2" \
        && simctl "$s" status > "$t/status" 2>&1 && grep -q "daemon pid $pid" "$t/status"; then
        pass "second-daemon: start and daemon both refused: $(head -n 1 "$t/daemon2"); the first still serves"
    else
        show "$t/start2" "$t/daemon2" "$t/status"
        fail "second-daemon: start exited $rc, daemon exited $rc2"
    fi
    simctl "$s" stop > /dev/null 2>&1
else
    fail "second-daemon: no daemon"
fi

# ---- a client of another user -----------------------------------------------------------------------------

t=$work/other-user
mkdir -p "$t"
chmod 755 "$t"
s=$t/socket
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv > /dev/null; then
    echo "SKIP other-user: needs root and setpriv to run a client as another user"
elif start_daemon "$s"; then
    # Copies another user can run whatever the checkout's permissions (bin/ and lib/, as installed).
    mkdir -p "$t/bin" "$t/lib"
    cp "$sim" "$t/bin/" && cp "$dir/lib/libsqdisc_sim_preload.so" "$t/lib/" && chmod -R a+rX "$t/bin" "$t/lib"
    as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups env SQDISC_SIM_SOCKET="$s" timeout 15 "$@"; }
    # The socket is the daemon user's only (mode 0600): another user cannot even connect.
    rc=0
    as_nobody "$t/bin/sqdisc-sim" status > "$t/status.mode" 2>&1 || rc=$?
    # Made reachable (a socket in a shared place, opened up): the daemon itself refuses the other uid.
    chmod 666 "$s"
    rc2=0
    as_nobody "$t/bin/sqdisc-sim" status > "$t/status.uid" 2>&1 || rc2=$?
    rc3=0
    as_nobody "$t/bin/sqdisc-sim" run -- ibv_devinfo > "$t/devinfo" 2>&1 || rc3=$?
    # The preload itself, without `sqdisc-sim run`'s check first: ibv_open_device fails with the reason.
    rc4=0
    as_nobody env LD_PRELOAD="$t/lib/libsqdisc_sim_preload.so" ibv_devinfo > "$t/devinfo.preload" 2>&1 || rc4=$?
    if [ $rc -ne 0 ] && grep -q 'Permission denied' "$t/status.mode" \
        && [ $rc2 -ne 0 ] && grep -q 'this daemon belongs to uid 0; uid 65534 may not use it' "$t/status.uid" \
        && [ $rc3 -ne 0 ] && grep -q 'cannot use the daemon on .*: this daemon belongs to uid 0; uid 65534 may not use it' "$t/devinfo" \
        && [ $rc4 -ne 0 ] && grep -q 'ibv_open_device: this daemon belongs to uid 0; uid 65534 may not use it' "$t/devinfo.preload" \
        && grep -q 'refused pid [0-9]*: it runs as uid 65534' "$s.log"; then
        pass "other-user: refused at connect (socket mode 0600) and by the daemon (status, run, the preload's ibv_open_device): $(grep -o 'this daemon belongs.*' "$t/status.uid" | head -n 1)"
    else
        show "$t/status.mode" "$t/status.uid" "$t/devinfo" "$t/devinfo.preload" "$s.log"
        fail "other-user: status exited $rc and $rc2, ibv_devinfo $rc3 and $rc4"
    fi
    simctl "$s" stop > /dev/null 2>&1
else
    fail "other-user: no daemon"
fi

# ---- a SEND's source reused before its completion -----------------------------------------------------------

t=$work/reuse-source
mkdir -p "$t"
s=$t/socket
# 10% loss each way: over 100 WQEs some are surely retransmitted (the chance that none is: 1e-9), and none
# loses all 8 tries (1.7e-6 each).
if start_daemon "$s" --loss-ppm 100000 --ack-loss-ppm 100000; then
    SQDISC_SIM_SOCKET=$s timeout 60 "$sim" run -- "$work/reuse_source" receiver "$t" > "$t/receiver.out" 2>&1 &
    receiver=$!
    rc=0
    SQDISC_SIM_SOCKET=$s timeout 60 "$sim" run -- "$work/reuse_source" sender "$t" > "$t/sender.out" 2>&1 || rc=$?
    rc2=0
    wait "$receiver" || rc2=$?
    rc3=0
    simctl "$s" report > "$t/report" 2>&1 || rc3=$?
    sender_pid=$(sed -n 's/^sender: pid \([0-9]*\) qp.*/\1/p' "$t/sender.out")
    sender_qp=$(sed -n 's/^sender: pid [0-9]* qp \(0x[0-9a-f]*\).*/\1/p' "$t/sender.out")
    # Each line names the process, the program, the QP and the WQE, whose wr_id the program set to 0x1000 + WQE.
    line=$(grep -E "^step [0-9]+ pid $sender_pid \(reuse_source\) qp $sender_qp wqe ([0-9]+): source modified while in flight: .* of send WQE #\1 \(wr_id 0x10[0-9a-f]{2}\) of qp $sender_qp" "$t/report" | head -n 1)
    wqe=$(sed -E -n 's/.* wqe ([0-9]+): .*/\1/p' <<< "$line")
    wrid=$(sed -E -n 's/.*\(wr_id (0x[0-9a-f]+)\).*/\1/p' <<< "$line")
    if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 3 ] && [ -n "$sender_pid" ] && [ -n "$line" ] \
        && [ "$((wrid))" -eq $((0x1000 + wqe)) ] && ! grep -v -E "pid $sender_pid \(reuse_source\)|violation\(s\)$" "$t/report" | grep -q .; then
        pass "reuse-source: report exit 3, $(head -n 1 "$t/report"), e.g. pid $sender_pid (reuse_source) qp $sender_qp wqe $wqe (wr_id $wrid)"
    else
        show "$t/sender.out" "$t/receiver.out" "$t/report"
        fail "reuse-source: sender exited $rc, receiver $rc2, report $rc3 (3 expected) without the expected line"
    fi
    simctl "$s" stop > /dev/null 2>&1
else
    fail "reuse-source: no daemon"
fi

echo "sim-device-tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
