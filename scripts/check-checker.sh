#!/usr/bin/env bash
# libsqdisc_check on the software HCA, against the staged install:
#   1. api_rules (c-tests/check/api_rules.c): every kind through the C API, with the QP and WQE it names, SQ
#      overflows reported before the provider sees the post, no finding for a program that keeps the rules;
#      run plain, under AddressSanitizer+UBSan, and under valgrind.
#   2. preload_workload (c-tests/check/preload_workload.c), a program linked only against libibverbs and the
#      sim, run plain and with LD_PRELOAD="libsqdisc_check.so sim_shim.so": the same output byte for byte, a
#      report naming every kind; SQDISC_CHECK=abort aborts at the first violation with the report;
#      SQDISC_CHECK=off writes nothing. The preloaded runs are plain dynamic builds only: preloading into an
#      ASan binary needs the ASan runtime first in LD_PRELOAD, which would test the sanitizer's set-up more
#      than the checker.
#   2c. programs the checker never attaches to (/bin/true, c-tests/check/track_only.c): the report at exit
#      still comes, and says nothing was watched.
#   2d. device_workload (c-tests/check/device_workload.c), linked only against libibverbs, on the sim device
#      (`sqdisc-sim run`), plain and with the checker preloaded and no adapter: the same output byte for byte, a
#      report naming every kind, and the daemon's own report naming the same QP and WQE.
#   3. The demo (examples/demo.c) under the checker, seeds 1 to 5 at depths 4 to 64: for the raw ULP, every violation the sim
#      logs of a kind a checker rule covers is reported by the checker too, on the same QP and WQE; for the
#      sqdisc ULP, no violation at all; and the demo's output (but its wall time) is the same as without it.
# c-tests/check/sim_shim.c tells the checker about the objects of the in-process sim (a program using
# sqdisc_sim.h makes them without libibverbs' constructors); docs/check.md explains it. On the sim device (2d)
# nothing of the kind is needed.
# usage: check-checker.sh STAGE_DIR LIBDIR_IN_STAGE
set -euo pipefail

stage=$1 libdir=$2
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/check-checker
CC=${CC:-cc}
stage_lib=$stage$libdir
CFLAGS_STRICT=(-std=c11 -Wall -Wextra -Wpedantic -Werror -g)
# The demo runs: SEED:DEPTH pairs.
RUNS=${SQDISC_CHECK_RUNS:-1:16 2:16 3:16 4:4 5:64}
REQUESTS=${SQDISC_CHECK_REQUESTS:-4000}

pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage_lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
if [ ! -f "$stage_lib/pkgconfig/sqdisc_check.pc" ]; then
    echo "check-checker: no sqdisc_check.pc in $stage (run \`make stage\`)" >&2
    exit 1
fi
rm -rf "$out"
mkdir -p "$out"
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() {
    echo "FAIL $1"
    if [ -n "${2:-}" ] && [ -s "$2" ]; then sed 's/^/    | /' "$2" | tail -n 40; fi
    failed=$((failed + 1))
}

# report_counts REPORT PASS_TEXT NAME KIND...: passes when the report counts at least one finding of every KIND.
report_counts() {
    local rep=$1 text=$2 name=$3 missing="" k
    shift 3
    for k in "$@"; do
        grep -Eq "^ +[1-9][0-9]* +$k" "$rep" || missing="$missing, $k"
    done
    if [ -z "$missing" ]; then pass "$text"; else fail "$name: the report lacks ${missing#, }" "$rep"; fi
}
read -r -a both_cflags <<< "$(pc --cflags sqdisc sqdisc_sim sqdisc_check)"
read -r -a both_libs <<< "$(pc --libs sqdisc sqdisc_sim sqdisc_check)"
read -r -a sim_cflags <<< "$(pc --cflags sqdisc sqdisc_sim)"
read -r -a sim_libs <<< "$(pc --libs sqdisc sqdisc_sim)"
checker=$stage_lib/libsqdisc_check.so
shim=$out/sim_shim.so
src=$root/c-tests/check
run() { local log=$1; shift; LD_LIBRARY_PATH=$stage_lib "$@" > "$log" 2>&1; }

# ---- 1. the API ----------------------------------------------------------------------------------------------
if "$CC" "${CFLAGS_STRICT[@]}" "${both_cflags[@]}" "$src/api_rules.c" -o "$out/api_rules" "${both_libs[@]}" \
    > "$out/api_rules.build" 2>&1; then
    run "$out/api_rules.log" "$out/api_rules" && pass "api_rules [dynamic]" || fail "api_rules [dynamic]" "$out/api_rules.log"
    if "$CC" "${CFLAGS_STRICT[@]}" -fsanitize=address,undefined -fno-omit-frame-pointer "${both_cflags[@]}" \
        "$src/api_rules.c" -o "$out/api_rules.asan" "${both_libs[@]}" > "$out/api_rules.asan.build" 2>&1; then
        ASAN_OPTIONS=detect_leaks=1:exitcode=23 UBSAN_OPTIONS=halt_on_error=1:exitcode=24 \
            run "$out/api_rules.asan.log" "$out/api_rules.asan" && pass "api_rules [sanitize]" \
            || fail "api_rules [sanitize]" "$out/api_rules.asan.log"
    else
        fail "api_rules [sanitize]: build" "$out/api_rules.asan.build"
    fi
    run "$out/api_rules.vg.log" valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=25 \
        "$out/api_rules" && pass "api_rules [valgrind]" || fail "api_rules [valgrind]" "$out/api_rules.vg.log"
else
    fail "api_rules: build" "$out/api_rules.build"
fi

# ---- 2. preloaded into an unmodified program -------------------------------------------------------------------
if ! "$CC" -std=c11 -Wall -Wextra -Werror -g -shared -fPIC "${both_cflags[@]}" "$src/sim_shim.c" -o "$shim" \
    "${both_libs[@]}" -ldl > "$out/shim.build" 2>&1; then
    fail "sim_shim: build" "$out/shim.build"
fi
if "$CC" "${CFLAGS_STRICT[@]}" "${sim_cflags[@]}" "$src/preload_workload.c" -o "$out/preload_workload" \
    "${sim_libs[@]}" > "$out/workload.build" 2>&1; then
    if readelf -d "$out/preload_workload" | grep -q 'NEEDED.*libsqdisc_check'; then
        fail "preload_workload links libsqdisc_check: it must not know of it"
    fi
    run "$out/plain.out" "$out/preload_workload" || fail "preload_workload [plain]" "$out/plain.out"
    rep=$out/report.txt
    if SQDISC_CHECK_REPORT=$rep SQDISC_CHECK_SAMPLE=1 SQDISC_CHECK_IDLE_MS=10 LD_PRELOAD="$checker $shim" \
        run "$out/preload.out" "$out/preload_workload"; then
        if cmp -s "$out/plain.out" "$out/preload.out"; then
            pass "preload_workload: the same output with the checker preloaded ($(wc -l < "$out/plain.out") lines)"
        else
            diff "$out/plain.out" "$out/preload.out" > "$out/preload.diff" || true
            fail "preload_workload: the checker changed what the program saw" "$out/preload.diff"
        fi
        report_counts "$rep" "preload_workload: the report at exit names every kind" "preload_workload" \
            "SQ overflow" "unsignaled run" "idle unsignaled tail" "CQ undersized" "MR invalidated while in use" \
            "unfenced LocalInv" "source modified while in flight" "flush of an unsignaled WQE"
    else
        fail "preload_workload [preloaded]: exit $?" "$out/preload.out"
    fi
    rc=0
    SQDISC_CHECK=abort SQDISC_CHECK_REPORT=$out/abort.txt LD_PRELOAD="$checker $shim" \
        run "$out/abort.out" "$out/preload_workload" || rc=$?
    if [ "$rc" -eq 134 ] && grep -q 'SQDISC_CHECK=abort: first violation' "$out/abort.txt" \
        && grep -q '^  *1  *CQ undersized' "$out/abort.txt" && ! grep -q '^done' "$out/abort.out"; then
        pass "preload_workload: SQDISC_CHECK=abort aborts at the first violation (the undersized CQ) with the report"
    else
        fail "preload_workload: SQDISC_CHECK=abort: exit $rc" "$out/abort.txt"
    fi
    # A program stopped by SIGTERM (as servers are) still gets its report, and still dies of the signal.
    WORKLOAD_WAIT=1 SQDISC_CHECK_REPORT=$out/signal.txt LD_PRELOAD="$checker $shim" LD_LIBRARY_PATH=$stage_lib \
        "$out/preload_workload" > "$out/signal.out" 2>&1 &
    pid=$!
    for _ in $(seq 100); do grep -q '^waiting' "$out/signal.out" && break; sleep 0.1; done
    kill -TERM "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" || rc=$?
    if [ "$rc" -eq 143 ] && grep -q 'report (signal 15)' "$out/signal.txt" 2>/dev/null \
        && grep -Eq '^ +1 +SQ overflow' "$out/signal.txt"; then
        pass "preload_workload: SIGTERM writes the report and ends the process with the signal"
    else
        fail "preload_workload: SIGTERM: exit $rc" "$out/signal.out"
    fi
    SQDISC_CHECK=off SQDISC_CHECK_REPORT=$out/off.txt LD_PRELOAD="$checker $shim" \
        run "$out/off.out" "$out/preload_workload" || true
    if cmp -s "$out/plain.out" "$out/off.out" && [ ! -e "$out/off.txt" ]; then
        pass "preload_workload: SQDISC_CHECK=off checks and reports nothing"
    else
        fail "preload_workload: SQDISC_CHECK=off" "$out/off.out"
    fi
else
    fail "preload_workload: build" "$out/workload.build"
fi

# ---- 2b. the interposed libibverbs functions ------------------------------------------------------------------
# c-tests/check/fake_verbs.c stands in for libibverbs' control path (objects made on the sim), so that the
# program's ibv_create_cq/ibv_create_qp/ibv_reg_mr/... reach the checker's definitions first and the stand-in's
# through dlsym(RTLD_NEXT), as libibverbs' on a real system. No sim_shim here.
if "$CC" -std=c11 -Wall -Wextra -Werror -g -shared -fPIC "${sim_cflags[@]}" "$src/fake_verbs.c" \
        -o "$out/libfakeverbs.so" "${sim_libs[@]}" > "$out/fake.build" 2>&1 \
    && "$CC" "${CFLAGS_STRICT[@]}" "${sim_cflags[@]}" "$src/interpose_workload.c" -o "$out/interpose_workload" \
        -L"$out" -lfakeverbs -Wl,-rpath,"$out" "${sim_libs[@]}" > "$out/interpose.build" 2>&1; then
    run "$out/interpose.plain" "$out/interpose_workload" || fail "interpose_workload [plain]" "$out/interpose.plain"
    rep=$out/interpose.report
    if SQDISC_CHECK_REPORT=$rep LD_PRELOAD="$checker" run "$out/interpose.checked" "$out/interpose_workload"; then
        cmp -s "$out/interpose.plain" "$out/interpose.checked" \
            && pass "interpose_workload: the same output with the checker preloaded" \
            || fail "interpose_workload: the checker changed what the program saw" "$out/interpose.checked"
        report_counts "$rep" "interpose_workload: objects made through the interposed ibv_* functions are checked" \
            "interpose_workload" "SQ overflow" "CQ undersized" "MR invalidated while in use" "flush of an unsignaled WQE"
    else
        fail "interpose_workload [preloaded]" "$out/interpose.checked"
    fi
else
    cat "$out/fake.build" "$out/interpose.build" > "$out/interpose.builds" 2>/dev/null || true
    fail "interpose_workload: build" "$out/interpose.builds"
fi

# ---- 2c. programs the checker never attaches to ----------------------------------------------------------------
# /bin/true uses no verbs at all; track_only tracks a CQ and a QP of a context it never attaches. Both still get
# the report at exit, which says that nothing was watched (and, for track_only, what tracking found).
rm -f "$out/none.txt"
if SQDISC_CHECK_REPORT=$out/none.txt LD_PRELOAD="$checker" run "$out/none.out" /bin/true \
    && grep -q '^sqdisc-check report (exit): 0 violations' "$out/none.txt" 2>/dev/null \
    && grep -q '^nothing watched' "$out/none.txt" && [ ! -s "$out/none.out" ]; then
    pass "a program that never uses verbs (/bin/true) gets a report at exit that says nothing was watched"
else
    fail "/bin/true under the checker: no report saying nothing was watched" "$out/none.txt"
fi
if "$CC" "${CFLAGS_STRICT[@]}" "${both_cflags[@]}" "$src/track_only.c" -o "$out/track_only" "${both_libs[@]}" \
    > "$out/track_only.build" 2>&1; then
    rm -f "$out/track_only.txt"
    if SQDISC_CHECK_REPORT=$out/track_only.txt run "$out/track_only.out" "$out/track_only" \
        && grep -q '^done' "$out/track_only.out" && grep -q '^nothing watched' "$out/track_only.txt" 2>/dev/null \
        && grep -Eq '^ +1 +CQ undersized' "$out/track_only.txt"; then
        pass "a program that only tracks objects of a context it never attached gets the report, nothing watched"
    else
        fail "track_only: no report at exit, or not the expected one" "$out/track_only.txt"
    fi
else
    fail "track_only: build" "$out/track_only.build"
fi

# ---- 2d. on the sim device, with no adapter -------------------------------------------------------------------
# c-tests/check/device_workload.c links only libibverbs and finds the sim as the device sqd_sim0 (the daemon
# and its preload library, `sqdisc-sim run`): the checker is preloaded as into any program, with nothing that
# tells it about the sim. Each run has a daemon of its own, so that QP numbers are the same in both outputs.
sim_cmd=$stage${libdir%/lib}/bin/sqdisc-sim
if [ ! -x "$sim_cmd" ]; then
    fail "device_workload: no $sim_cmd in the stage"
elif "$CC" "${CFLAGS_STRICT[@]}" "$src/device_workload.c" -o "$out/device_workload" -libverbs \
    > "$out/device_workload.build" 2>&1; then
    sim_run() { # OUTPUT [ENV=VALUE...]: device_workload under a daemon of its own, then the daemon's report
        local output=$1 rc=0
        shift
        SQDISC_SIM_SOCKET=$out/simdev/socket timeout 15 "$sim_cmd" stop > /dev/null 2>&1 || true
        env SQDISC_SIM_SOCKET="$out/simdev/socket" "$@" timeout -k 2 60 "$sim_cmd" run -- "$out/device_workload" \
            > "$output" 2>&1 || rc=$?
        SQDISC_SIM_SOCKET=$out/simdev/socket timeout 15 "$sim_cmd" report > "$output.sim" 2>&1 || true
        SQDISC_SIM_SOCKET=$out/simdev/socket timeout 15 "$sim_cmd" stop > /dev/null 2>&1 || true
        return $rc
    }
    if ! sim_run "$out/device.plain"; then
        fail "device_workload [plain]" "$out/device.plain"
    elif sim_run "$out/device.checked" LD_PRELOAD="$checker" SQDISC_CHECK_REPORT="$out/device.report.%p" \
        SQDISC_CHECK_SAMPLE=1 SQDISC_CHECK_IDLE_MS=10; then
        if cmp -s "$out/device.plain" "$out/device.checked"; then
            pass "device_workload on the sim device: the same output with the checker preloaded ($(wc -l < "$out/device.plain") lines)"
        else
            diff "$out/device.plain" "$out/device.checked" > "$out/device.diff" || true
            fail "device_workload on the sim device: the checker changed what the program saw" "$out/device.diff"
        fi
        # One report per process: the program's is the one that watched something (`sqdisc-sim run` gets one too).
        rep=$(grep -L '^nothing watched' "$out"/device.report.* 2>/dev/null | head -n 1)
        if [ -n "$rep" ]; then
            report_counts "$rep" "device_workload on the sim device: the report names every kind" "device_workload" \
                "SQ overflow" "unsignaled run" "idle unsignaled tail" "CQ undersized" "MR invalidated while in use" \
                "unfenced LocalInv" "source modified while in flight" "flush of an unsignaled WQE"
        else
            fail "device_workload on the sim device: no report of the program" "$out/device.checked"
        fi
        # The device's own oracle saw the two invalidations of an MR in use too, on the same QP and WQE.
        if grep -q 'qp 0x202 wqe 1: MR invalidated while in use: LOCAL_INV' "$out/device.checked.sim" \
            && grep -q 'qp 0x202 wqe 4: MR invalidated while in use: ibv_dereg_mr' "$out/device.checked.sim" \
            && grep -q 'qp 0x202 wqe #4: MR invalidated while in use: ibv_dereg_mr' "$rep"; then
            pass "device_workload on the sim device: the daemon's report and the checker's name the same QP and WQE"
        else
            fail "device_workload on the sim device: the daemon's report" "$out/device.checked.sim"
        fi
    else
        fail "device_workload [checker preloaded]" "$out/device.checked"
    fi
else
    fail "device_workload: build" "$out/device_workload.build"
fi

# ---- 3. the demo ---------------------------------------------------------------------------------------------
if "$CC" "${CFLAGS_STRICT[@]}" "${sim_cflags[@]}" "$root/examples/demo.c" -o "$out/demo" "${sim_libs[@]}" \
    > "$out/demo.build" 2>&1; then
    for sd in $RUNS; do
        seed=${sd%%:*}
        args=(--seed "$seed" --depth "${sd#*:}" --requests "$REQUESTS")
        run "$out/demo-$seed.plain" "$out/demo" "${args[@]}" || true
        rc=0
        SQDISC_CHECK_COMPARE=1 SQDISC_CHECK_SAMPLE=1 SQDISC_CHECK_FIRST=10000000 SQDISC_CHECK_IDLE_MS=0 \
            SQDISC_CHECK_REPORT=$out/demo-$seed.report LD_PRELOAD="$checker $shim" \
            run "$out/demo-$seed.checked" "$out/demo" "${args[@]}" || rc=$?
        raw=$(grep '^compare sim 0:' "$out/demo-$seed.checked" || true)
        managed=$(grep '^compare sim 1:' "$out/demo-$seed.checked" || true)
        if [ -n "$raw" ] && grep -q 'unmatched 0$' <<<"$raw" && ! grep -q 'sim 0 violations' <<<"$raw"; then
            pass "demo seed $seed depth ${sd#*:}, raw ULP: the checker reported every sim violation its rules cover: ${raw#compare sim 0: }"
        else
            fail "demo seed $seed depth ${sd#*:}, raw ULP: ${raw:-no comparison}" "$out/demo-$seed.checked"
        fi
        if [ -n "$managed" ] && grep -q 'sim 0 violations' <<<"$managed" && grep -q 'checker 0 violations' <<<"$managed"; then
            pass "demo seed $seed depth ${sd#*:}, sqdisc ULP: no violation from the sim or the checker"
        else
            fail "demo seed $seed depth ${sd#*:}, sqdisc ULP: ${managed:-no comparison}" "$out/demo-$seed.checked"
        fi
        if [ "$rc" -eq 0 ] && cmp -s <(grep -v -e '^compare sim' -e '^UNMATCHED' -e 'wall time' "$out/demo-$seed.checked") \
            <(grep -v 'wall time' "$out/demo-$seed.plain"); then
            pass "demo seed $seed depth ${sd#*:}: the same output and exit status as without the checker"
        else
            fail "demo seed $seed depth ${sd#*:}: the checker changed the demo's output or exit status ($rc)" "$out/demo-$seed.checked"
        fi
    done
else
    fail "demo: build" "$out/demo.build"
fi

echo "check-checker: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
