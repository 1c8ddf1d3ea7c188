#!/usr/bin/env bash
# Builds every c-tests/*.c against the staged install, only through pkg-config, and runs it four ways:
#   dynamic   linked to libsqdisc.so and libsqdisc_sim.so, run with LD_LIBRARY_PATH into the stage
#   static    linked to libsqdisc.a and libsqdisc_sim.a (pkg-config --static), run with no path into the stage
#   sanitize  the dynamic build with AddressSanitizer (leak detection on) and UndefinedBehaviorSanitizer
#   valgrind  the dynamic build under memcheck with full leak checking
# Probes in c-tests/support first prove that the sanitizers and valgrind really report faults here.
# Every test links `pkg-config sqdisc sqdisc_sim`; one that uses the scripted test device (it includes
# <sqdisc_scripted.h>, directly or through c-tests/support/harness.h) also links the test-only
# libsqdisc_scripted from SCRIPTED_LIBDIR (the Makefile's build/test/lib), its header from c-tests/support.
# usage: c-tests.sh STAGE_DIR LIBDIR_IN_STAGE SCRIPTED_LIBDIR
set -euo pipefail

stage=$1 libdir=$2 scripted_lib=$3
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/c-tests
CC=${CC:-cc}
CFLAGS_STRICT=(-std=c11 -Wall -Wextra -Wpedantic -Werror -g)
SANITIZE=(-fsanitize=address,undefined -fno-omit-frame-pointer)
stage_lib=$stage$libdir

pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage_lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}

if [ ! -f "$stage_lib/pkgconfig/sqdisc.pc" ]; then
    echo "c-tests: no staged install in $stage (run \`make stage\`)" >&2
    exit 1
fi
if [ ! -f "$stage_lib/pkgconfig/sqdisc_sim.pc" ]; then
    echo "c-tests: the staged install has no sqdisc_sim.pc (run \`make stage\`)" >&2
    exit 1
fi
if [ ! -f "$scripted_lib/libsqdisc_scripted.so" ] || [ ! -f "$scripted_lib/libsqdisc_scripted.a" ]; then
    echo "c-tests: no libsqdisc_scripted in $scripted_lib (run \`make scripted-lib\`)" >&2
    exit 1
fi
read -r -a cflags <<< "$(pc --cflags sqdisc sqdisc_sim)"
read -r -a libs <<< "$(pc --libs sqdisc sqdisc_sim)"
read -r -a static_libs <<< "$(pc --static --libs sqdisc sqdisc_sim)"
# Take libsqdisc and libsqdisc_sim from their archives; the system libraries they need stay shared.
for i in "${!static_libs[@]}"; do
    case ${static_libs[$i]} in
        -lsqdisc|-lsqdisc_sim) static_libs[$i]="-Wl,-Bstatic ${static_libs[$i]} -Wl,-Bdynamic" ;;
    esac
done
read -r -a static_libs <<< "${static_libs[*]}"
# c-tests/spdk_*.c drive libsqdisc_spdk, the SPDK provider, on the software HCA of libsqdisc: they link both,
# and export their stand-ins for SPDK's functions to the provider (-rdynamic).
if [ ! -f "$stage_lib/pkgconfig/sqdisc_spdk.pc" ]; then
    echo "c-tests: the staged install has no sqdisc_spdk.pc (run \`make stage\`)" >&2
    exit 1
fi
read -r -a spdk_cflags <<< "$(pc --cflags sqdisc_spdk sqdisc sqdisc_sim)"
read -r -a spdk_libs <<< "-rdynamic $(pc --libs sqdisc_spdk sqdisc sqdisc_sim)"
read -r -a spdk_static_libs <<< "-rdynamic $(pc --static --libs sqdisc_spdk sqdisc sqdisc_sim)"
for i in "${!spdk_static_libs[@]}"; do
    case ${spdk_static_libs[$i]} in
        -lsqdisc|-lsqdisc_spdk|-lsqdisc_sim) spdk_static_libs[$i]="-Wl,-Bstatic ${spdk_static_libs[$i]} -Wl,-Bdynamic" ;;
    esac
done
read -r -a spdk_static_libs <<< "${spdk_static_libs[*]}"

rm -rf "$out"
mkdir -p "$out"/{dynamic,static,sanitize,probes,logs}
passed=0 failed=0 skipped=0

pass() { echo "PASS $1"; passed=$((passed + 1)); }
# A run that exited 0 (name, log). Its "SKIP <check>: <why>" lines (checks that cannot run in that mode) are
# shown and counted, so that a skipped check never reads as a passed one: a run that passed checks as well is
# a PASS with its SKIP lines under it; a run that only skipped is a SKIP, not a PASS.
passed_run() {
    local n
    n=$(grep -c '^SKIP' "$2" || true)
    if [ "$n" -eq 0 ]; then
        pass "$1"
        return
    fi
    skipped=$((skipped + n))
    if grep -q '^PASS' "$2"; then
        pass "$1"
    else
        echo "SKIP $1: every check of it skipped in this mode"
    fi
    grep '^SKIP' "$2" | sed 's/^/    | /'
}
fail() {
    echo "FAIL $1"
    if [ -n "${2:-}" ] && [ -s "$2" ]; then sed 's/^/    | /' "$2" | tail -n 40; fi
    failed=$((failed + 1))
}

# run LOG CMD...: runs a built program with the stage's library path; its output goes to LOG.
run_dyn() { local log=$1; shift; LD_LIBRARY_PATH=$stage_lib "$@" > "$log" 2>&1; }

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=23
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=24
VALGRIND=(valgrind -q --leak-check=full --errors-for-leak-kinds=definite,possible --error-exitcode=25)

# ---- probes: a skipped check must never look like a passed one -------------------------------------------

probe() { # name source extra-cc-flags... -- expected-text expected-exit [runner...]
    local name=$1 src=$2; shift 2
    local flags=()
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    local expect=$1 code=$2; shift 2
    local exe=$out/probes/$name log=$out/logs/probe-$name.log
    if ! "$CC" -std=c11 -g "${flags[@]}" "${cflags[@]}" "$src" -o "$exe" "${libs[@]}" > "$log" 2>&1; then
        fail "probe $name: did not build" "$log"; return
    fi
    local rc=0
    run_dyn "$log" "$@" "$exe" || rc=$?
    if [ "$rc" -eq "$code" ] && grep -q -- "$expect" "$log"; then
        pass "probe $name: reported ($expect, exit $rc)"
    else
        fail "probe $name: expected exit $code and \"$expect\", got exit $rc" "$log"
    fi
}
support=$root/c-tests/support
probe asan "$support/probe_overflow.c" "${SANITIZE[@]}" -- "ERROR: AddressSanitizer: heap-buffer-overflow" 23
probe lsan "$support/probe_leak.c" "${SANITIZE[@]}" -- "ERROR: LeakSanitizer: detected memory leaks" 23
probe ubsan "$support/probe_ub.c" "${SANITIZE[@]}" -- "runtime error: signed integer overflow" 24
probe valgrind "$support/probe_leak.c" -- "definitely lost" 25 "${VALGRIND[@]}"

# ---- the tests -----------------------------------------------------------------------------------------------

shopt -s nullglob
tests=("$root"/c-tests/*.c)
if [ ${#tests[@]} -eq 0 ]; then
    echo "c-tests: no c-tests/*.c found" >&2
    exit 1
fi
# The README's C example is a test too: its first ```c block, exactly as a reader would copy it.
mkdir -p "$out/gen"
awk '/^```c$/ && !done { grab = 1; next } /^```$/ && grab { grab = 0; done = 1 } grab' "$root/README.md" \
    > "$out/gen/readme_snippet.c"
if [ ! -s "$out/gen/readme_snippet.c" ]; then
    echo "c-tests: README.md has no \`\`\`c example block" >&2
    exit 1
fi
tests+=("$out/gen/readme_snippet.c")

for src in "${tests[@]}"; do
    t=$(basename "$src" .c)
    logs=$out/logs/$t
    if [[ $t == spdk_* ]]; then
        t_cflags=("${spdk_cflags[@]}") t_libs=("${spdk_libs[@]}") t_static_libs=("${spdk_static_libs[@]}")
    else
        t_cflags=("${cflags[@]}") t_libs=("${libs[@]}") t_static_libs=("${static_libs[@]}")
    fi
    if grep -qE '#include [<"](sqdisc_scripted|support/harness)\.h[>"]' "$src"; then
        t_cflags+=(-I"$root/c-tests/support")
        t_libs+=(-L"$scripted_lib" -lsqdisc_scripted -Wl,-rpath,"$scripted_lib")
        t_static_libs+=("$scripted_lib/libsqdisc_scripted.a")
    fi

    # dynamic
    exe=$out/dynamic/$t
    if ! "$CC" "${CFLAGS_STRICT[@]}" "${t_cflags[@]}" "$src" -o "$exe" "${t_libs[@]}" > "$logs.dynamic.build" 2>&1; then
        fail "$t [dynamic]: build" "$logs.dynamic.build"
        for mode in static sanitize valgrind; do fail "$t [$mode]: not run, the dynamic build failed"; done
        continue
    fi
    resolved=$(LD_LIBRARY_PATH=$stage_lib ldd "$exe" | awk '$1 ~ /^libsqdisc(_spdk|_sim)?\.so/ { print $3 }')
    if [ -z "$resolved" ] || grep -qv "^$stage_lib/" <<<"$resolved"; then
        echo "libsqdisc resolves to '$resolved'" > "$logs.dynamic.run"
        fail "$t [dynamic]: libsqdisc does not come from the stage" "$logs.dynamic.run"
    elif run_dyn "$logs.dynamic.run" "$exe"; then
        passed_run "$t [dynamic]" "$logs.dynamic.run"
    else
        fail "$t [dynamic]: exit $?" "$logs.dynamic.run"
    fi

    # static
    exe_s=$out/static/$t
    if ! "$CC" "${CFLAGS_STRICT[@]}" "${t_cflags[@]}" "$src" -o "$exe_s" "${t_static_libs[@]}" > "$logs.static.build" 2>&1; then
        fail "$t [static]: build" "$logs.static.build"
    elif ! readelf -d "$exe_s" > "$logs.static.dynamic" || grep -q 'NEEDED.*libsqdisc' "$logs.static.dynamic"; then
        cp "$logs.static.dynamic" "$logs.static.build"
        fail "$t [static]: still needs libsqdisc.so" "$logs.static.build"
    elif env -u LD_LIBRARY_PATH "$exe_s" > "$logs.static.run" 2>&1; then
        passed_run "$t [static]" "$logs.static.run"
    else
        fail "$t [static]: exit $?" "$logs.static.run"
    fi

    # sanitize
    exe_z=$out/sanitize/$t
    if ! "$CC" "${CFLAGS_STRICT[@]}" "${SANITIZE[@]}" "${t_cflags[@]}" "$src" -o "$exe_z" "${t_libs[@]}" \
        > "$logs.sanitize.build" 2>&1; then
        fail "$t [sanitize]: build" "$logs.sanitize.build"
    elif ! nm "$exe_z" > "$logs.sanitize.nm" || ! grep -q '__asan_init' "$logs.sanitize.nm" \
        || ! grep -q '__ubsan_handle_' "$logs.sanitize.nm"; then
        grep -E '__(asan|ubsan)' "$logs.sanitize.nm" > "$logs.sanitize.build" || true
        fail "$t [sanitize]: the binary is not instrumented (no __asan_init / __ubsan_handle_*)" "$logs.sanitize.build"
    elif run_dyn "$logs.sanitize.run" "$exe_z"; then
        passed_run "$t [sanitize]" "$logs.sanitize.run"
    else
        fail "$t [sanitize]: exit $?" "$logs.sanitize.run"
    fi

    # valgrind
    if run_dyn "$logs.valgrind.run" "${VALGRIND[@]}" "$exe"; then
        passed_run "$t [valgrind]" "$logs.valgrind.run"
    else
        fail "$t [valgrind]: exit $?" "$logs.valgrind.run"
    fi
done

echo "c-tests: $passed passed, $failed failed, $skipped check(s) skipped in some mode (the SKIP lines above)"
[ "$failed" -eq 0 ]
