#!/usr/bin/env bash
# The Rust library without features (what a Rust user or the SPDK provider builds on) defines no C symbol and
# holds no test device: every `#[no_mangle]` function of the C ABI sits behind the `capi` feature, so a Rust
# program that links the rlib never exports `sqd_*` functions of its own, and the software HCA and the scripted
# device sit behind `sim` and `scripted`. Builds the rlib without features and fails on any defined, global,
# unmangled symbol and on any code of `sqdisc::sim` or `sqdisc::scripted`.
#
# usage: check-rlib-symbols.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}

rlib=$("$CARGO" rustc -p sqdisc --lib --crate-type rlib --message-format=json-render-diagnostics 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "sqdisc":
        print(*[f for f in m["filenames"] if f.endswith(".rlib")])')
if [ -z "$rlib" ] || [ ! -f "$rlib" ]; then
    echo "check-rlib-symbols: cargo built no rlib of sqdisc" >&2
    exit 1
fi
# Rust symbols are mangled (_ZN... legacy, _R... v0); a C symbol is not. Rust's own unmangled symbols (the
# allocator shims, rust_eh_personality) come from the standard library, not from this rlib.
c_symbols=$(nm --defined-only --extern-only "$rlib" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ {print $3}' \
    | grep -v -E '^(_ZN|_R|__rust|rust_)' || true)
if [ -n "$c_symbols" ]; then
    echo "check-rlib-symbols: $rlib (no features) defines C symbols:" >&2
    echo "$c_symbols" >&2
    exit 1
fi
# Nor does it carry the test devices (features sim, scripted): no code of sqdisc::sim or sqdisc::scripted.
devices=$(nm --defined-only --demangle "$rlib" 2>/dev/null | grep -E ' sqdisc::(sim|scripted)::' | head -n 5 || true)
if [ -n "$devices" ]; then
    echo "check-rlib-symbols: $rlib (no features) holds code of the test devices:" >&2
    echo "$devices" >&2
    exit 1
fi
echo "check-rlib-symbols: $(basename "$rlib") built without features defines no C symbol and no test device"
