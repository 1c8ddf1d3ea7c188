#!/usr/bin/env bash
# Runs the library's Rust tests that exercise its unsafe code under Miri, the interpreter that detects undefined
# behaviour (use after free, out-of-bounds or misaligned access, invalid values, aliasing violations under
# Stacked Borrows, leaks, data races between threads).
#
# What runs, and why these (docs/testing.md, "Undefined behaviour and lifetimes"):
#   --lib                       the discipline core's unit tests (ring, tokens, signaling, budget, SRQ slots)
#   --test queue on_scripted    the queue contract through src/verbs on the scripted device
#   --test deferred, events     deferred actions, invalidation barriers, async events (release-all paths)
#   --test out_of_order         completions out of RC order, through a poll op of the test's own
#   --test capi_reentrant       the C ABI (sqd_* extern "C" functions) driven from Rust, with release, deferred
#                               and done callbacks that post, poll other CQs, free and defer from inside
#   --test teardown             every destruction order of handles and device objects, frees from callbacks
#   -p sqdisc-device --lib      the device seam's registry and last error, through a self-forwarding resolution
# tests/queue's on_sim half stays out for time: the software HCA's model is safe code, interpreted many times
# slower than native, and the library's unsafe paths it reaches are the ones on_scripted covers (teardown's
# SRQ scenarios do run on the sim, which has the only SRQ).
#
# Flags (MIRIFLAGS):
#   -Zmiri-permissive-provenance  an SGE's address is an integer by the verbs ABI (`ibv_sge.addr`), and buffer
#                                 verification reads the bytes it names, so the library must cast it back to a
#                                 pointer. Permissive provenance allows that cast without a warning, and only to
#                                 memory whose pointer was exposed (cast to an integer) before: a cast to any
#                                 other address is still reported. Strict provenance would reject the cast itself.
# Isolation stays on (no -Zmiri-disable-isolation): the tests read no clock, file or environment. Stacked
# Borrows (the default aliasing model) and leak checking stay on.
#
# usage: miri.sh            (MIRI_TOOLCHAIN=nightly by default)
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=${MIRI_TOOLCHAIN:-nightly}
if ! cargo "+$toolchain" miri --version >/dev/null 2>&1; then
    echo "miri: cargo +$toolchain miri is not available; run scripts/install-deps.sh (or:" >&2
    echo "  rustup toolchain install $toolchain --profile minimal --component miri rust-src)" >&2
    exit 1
fi

export MIRIFLAGS="${MIRIFLAGS:--Zmiri-permissive-provenance}"
start=$(date +%s)
run() {
    echo "miri: cargo +$toolchain miri test $*"
    cargo "+$toolchain" miri test --features capi --no-fail-fast "$@"
}
run --lib
run --test queue on_scripted
run --test deferred --test events --test out_of_order
run --test capi_reentrant
run --test teardown
echo "miri: cargo +$toolchain miri test -p sqdisc-device --lib"
cargo "+$toolchain" miri test -p sqdisc-device --lib --no-fail-fast
echo "miri: all runs passed in $(($(date +%s) - start)) s (MIRIFLAGS=$MIRIFLAGS)"
