#!/usr/bin/env bash
# ThreadSanitizer on the thread-safe mode: c-tests/threads.c (posting threads and a poller on one
# SQD_CQ_THREAD_SAFE CQ) and c-tests/armed_tail.c (a poller asleep on an armed CQ's channel while another
# thread posts) built with gcc -fsanitize=thread against a libsqdisc.so whose Rust code, standard
# library included, is instrumented too (nightly rustc -Zsanitizer=thread -Zbuild-std). An uninstrumented
# library hides its locks from TSan, which then reports races on everything they protect; instrumented, the
# run must be clean with no suppression at all.
#
# A probe first proves that this setup reports a real race inside the library (c-tests/support/probe_race.c
# posts and polls from two threads on a CQ made without SQD_CQ_THREAD_SAFE).
# c-tests/support/tsan_shim.c supplies __tsan_memcpy/memmove/memset, which nightly rustc's LLVM emits and gcc
# 12's libtsan lacks, by forwarding to the memcpy/memmove/memset that libtsan intercepts.
#
# usage: tsan.sh            (MIRI_TOOLCHAIN's nightly, default `nightly`, with rust-src)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

toolchain=${MIRI_TOOLCHAIN:-nightly}
target=x86_64-unknown-linux-gnu
out=$root/build/tsan
CC=${CC:-cc}
mkdir -p "$out/lib"

# The tests drive the software HCA (and its C functions, libsqdisc_sim's): both libraries are built instrumented,
# libsqdisc.so from the sqdisc crate (feature capi, its export map) and libsqdisc_sim.so from the sqdisc-sim
# crate (features capi,scripted; its export map plus a node for the test-only `sqd_scripted_*`). The sim's copy of
# the device seam finds libsqdisc's registry in global scope, as in the uninstrumented build.
{
    sed '/^ *local:/,/^ *\*;/d' "$root/sim/sqdisc_sim.map"
    printf 'SQDISC_TSAN_TEST {\n    global:\n        sqd_scripted_*;\n    local:\n        *;\n};\n'
} > "$out/tsan-sim.map"
echo "tsan: building libsqdisc.so and libsqdisc_sim.so with -Zsanitizer=thread -Zbuild-std ($toolchain)"
RUSTFLAGS="-Zsanitizer=thread" CARGO_TARGET_DIR=$root/target/tsan \
    cargo "+$toolchain" rustc --quiet -p sqdisc --lib --features capi --release -Zbuild-std --target "$target" --crate-type cdylib \
    -- -C link-arg=-Wl,-soname,libsqdisc.so.0 -C link-arg=-Wl,--version-script="$root/src/capi/sqdisc.map"
RUSTFLAGS="-Zsanitizer=thread" CARGO_TARGET_DIR=$root/target/tsan \
    cargo "+$toolchain" rustc --quiet -p sqdisc-sim --lib --features capi,scripted --release -Zbuild-std --target "$target" --crate-type cdylib \
    -- -C link-arg=-Wl,-soname,libsqdisc_sim.so.0 -C link-arg=-Wl,--version-script="$out/tsan-sim.map"
cp -f "target/tsan/$target/release/libsqdisc.so" "$out/lib/libsqdisc.so.0"
ln -sfn libsqdisc.so.0 "$out/lib/libsqdisc.so"
cp -f "target/tsan/$target/release/libsqdisc_sim.so" "$out/lib/libsqdisc_sim.so.0"
ln -sfn libsqdisc_sim.so.0 "$out/lib/libsqdisc_sim.so"
for lib in libsqdisc libsqdisc_sim; do
    nm -D "$out/lib/$lib.so.0" > "$out/$lib.nm.txt"
    if ! grep -q ' U __tsan_func_entry' "$out/$lib.nm.txt"; then
        echo "tsan: $lib is not instrumented (no __tsan_func_entry reference)" >&2
        exit 1
    fi
done

build() { # exe source
    "$CC" -std=c11 -Wall -Wextra -Werror -g -fsanitize=thread -Iinclude -Ic-tests/support "$2" c-tests/support/tsan_shim.c \
        -o "$1" -L"$out/lib" -lsqdisc_sim -lsqdisc -libverbs -lpthread -Wl,-rpath,"$out/lib"
}
export TSAN_OPTIONS="exitcode=66 halt_on_error=0"

# The probe: a race inside the library must be reported (exit 66, a frame in libsqdisc).
build "$out/probe_race" c-tests/support/probe_race.c
rc=0
"$out/probe_race" > "$out/probe_race.log" 2>&1 || rc=$?
if [ "$rc" -ne 66 ] || ! grep -q 'WARNING: ThreadSanitizer: data race' "$out/probe_race.log" \
    || ! grep -q 'libsqdisc.so' "$out/probe_race.log"; then
    echo "tsan: FAIL probe: expected exit 66 and a data race inside libsqdisc, got exit $rc" >&2
    tail -n 40 "$out/probe_race.log" >&2
    exit 1
fi
echo "tsan: PASS probe: a race inside the library is reported"

failed=0
for t in threads armed_tail; do
    build "$out/$t" "c-tests/$t.c"
    rc=0
    "$out/$t" > "$out/$t.log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ] && ! grep -q 'ThreadSanitizer' "$out/$t.log"; then
        echo "tsan: PASS $t"
    else
        echo "tsan: FAIL $t (exit $rc)"
        tail -n 60 "$out/$t.log"
        failed=1
    fi
done
# The SPDK provider's lock-free poll path (spdk/src/interpose.rs): its unit tests poll managed and unmanaged CQs
# from two threads through their contexts' patched poll_cq while a third makes CQs managed and unmanaged on devices
# that come and go (routes, static owner slots and turns, snapshots and owner records reclaimed), built and run
# with the same instrumentation (std included); the run must print no report.
rc=0
RUSTFLAGS="-Zsanitizer=thread" CARGO_TARGET_DIR=$root/target/tsan-spdk \
    cargo "+$toolchain" test --quiet -Zbuild-std --target "$target" -p sqdisc-spdk --lib > "$out/spdk-interpose.log" 2>&1 || rc=$?
if [ "$rc" -eq 0 ] && ! grep -q 'ThreadSanitizer' "$out/spdk-interpose.log"; then
    echo "tsan: PASS spdk provider poll path (sqdisc-spdk unit tests)"
else
    echo "tsan: FAIL spdk provider poll path (exit $rc)"
    tail -n 60 "$out/spdk-interpose.log"
    failed=1
fi
exit "$failed"
