#!/usr/bin/env bash
# The Rust libraries without features define no C symbol: every `#[no_mangle]` function of sqdisc's C ABI sits
# behind its `capi` feature and every one of the test devices' (`sqd_sim_*`, `sqd_scripted_*`) behind sqdisc-sim's,
# so a Rust program that links the rlibs (a Rust user, the SPDK provider, the device daemon) never exports `sqd_*`
# functions of its own. Builds the rlibs of sqdisc, sqdisc-sim (the software HCA, sim/) and sqdisc-device (the
# device seam, device/) without features and fails on any defined, global, unmangled symbol; and on any code of
# the test devices in sqdisc's rlib (they are a crate of their own, which sqdisc does not depend on).
#
# usage: check-rlib-symbols.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

rlib_of() { # package lib-name
    "$CARGO" rustc -p "$1" --lib --crate-type rlib --message-format=json-render-diagnostics 2>/dev/null \
        | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1]:
        print(*[f for f in m["filenames"] if f.endswith(".rlib")])' "$2"
}

for pkg in sqdisc:sqdisc sqdisc-sim:sqdisc_sim sqdisc-device:sqdisc_device; do
    rlib=$(rlib_of "${pkg%%:*}" "${pkg#*:}")
    if [ -z "$rlib" ] || [ ! -f "$rlib" ]; then
        echo "check-rlib-symbols: cargo built no rlib of ${pkg%%:*}" >&2
        exit 1
    fi
    # Rust symbols are mangled (_ZN... legacy, _R... v0); a C symbol is not. Rust's own unmangled symbols (the
    # allocator shims, rust_eh_personality) come from the standard library, not from these rlibs.
    c_symbols=$(nm --defined-only --extern-only "$rlib" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ {print $3}' \
        | grep -v -E '^(_ZN|_R|__rust|rust_)' || true)
    if [ -n "$c_symbols" ]; then
        echo "check-rlib-symbols: $rlib (no features) defines C symbols:" >&2
        echo "$c_symbols" >&2
        exit 1
    fi
    echo "check-rlib-symbols: $(basename "$rlib") built without features defines no C symbol"
done
devices=$(nm --defined-only --demangle "$(rlib_of sqdisc sqdisc)" 2>/dev/null | grep -E ' sqdisc_sim::' | head -n 5 || true)
if [ -n "$devices" ]; then
    echo "check-rlib-symbols: sqdisc's rlib holds code of the test devices:" >&2
    echo "$devices" >&2
    exit 1
fi
echo "check-rlib-symbols: sqdisc's rlib holds no code of the test devices"
