#!/usr/bin/env bash
# Fuzzes the C API: the cargo-fuzz target fuzz/fuzz_targets/c_api.rs (libFuzzer with AddressSanitizer and
# LeakSanitizer, on the nightly toolchain). docs/testing.md, "Fuzzing the C API", explains what it drives.
#
# usage: fuzz.sh smoke   replay the seed corpus fuzz/corpus/c_api, then fuzz until FUZZ_SMOKE_SECONDS (30)
#                        have passed in all, with a fixed seed (FUZZ_SEED, 1); new inputs go to a scratch
#                        directory, never into the repository. `make fuzz-smoke`, run by `make check`.
#        fuzz.sh long    fuzz for FUZZ_SECONDS (600), starting from the seed corpus and what earlier long runs
#                        found (build/fuzz/corpus, kept between runs). `make fuzz`.
#        fuzz.sh merge   add to fuzz/corpus/c_api the inputs of build/fuzz/corpus that reach new coverage
#                        (libFuzzer -set_cover_merge=1, which keeps the corpus small); commit the result.
#        fuzz.sh rebuild replace fuzz/corpus/c_api by a set-cover merge of itself and build/fuzz/corpus: after
#                        a change to the program's format, when every input decodes to another program and
#                        the old seeds no longer reach what they did (run `make fuzz` first); commit the result.
# Any crash, panic, sanitizer report, leak or failed check stops the run with a non-zero status, and the input
# that caused it is written to build/fuzz/artifacts/. Reproduce it with
#   cargo +nightly fuzz run c_api --fuzz-dir fuzz build/fuzz/artifacts/crash-...
# and print the program it decodes to with
#   cargo +nightly fuzz fmt c_api --fuzz-dir fuzz build/fuzz/artifacts/crash-...
set -euo pipefail

mode=${1:-smoke}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=c_api
seeds=fuzz/corpus/$target
out=build/fuzz
toolchain=${FUZZ_TOOLCHAIN:-nightly}
max_len=${FUZZ_MAX_LEN:-4096}

if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! cargo "+$toolchain" --version >/dev/null 2>&1; then
    echo "fuzz: no $toolchain Rust toolchain (run \`make deps\`)" >&2
    exit 1
fi
if ! cargo "+$toolchain" fuzz --version >/dev/null 2>&1; then
    echo "fuzz: cargo-fuzz is not installed (run \`make deps\`)" >&2
    exit 1
fi

mkdir -p "$out/artifacts"
echo "fuzz: building $target (cargo-fuzz, $toolchain, AddressSanitizer)"
cargo "+$toolchain" fuzz build "$target" --fuzz-dir fuzz
bin=fuzz/target/x86_64-unknown-linux-gnu/release/$target
[ -x "$bin" ] || { echo "fuzz: $bin was not built" >&2; exit 1; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_odr_violation=0}
common=(-max_len="$max_len" -artifact_prefix="$out/artifacts/" -print_final_stats=1 -detect_leaks=1)
log=$out/$mode.log

# Runs libFuzzer, keeps its output in $log, and prints the summary: executions, coverage, corpus.
run() {
    local rc=0
    "$bin" "${common[@]}" "$@" > "$log" 2>&1 || rc=$?
    grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$log" || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    if [ "$rc" -ne 0 ]; then
        echo "fuzz: FAILED (exit $rc); the end of $log:" >&2
        grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$log" | tail -n 60 >&2
        ls -1t "$out"/artifacts/* 2>/dev/null | head -n 3 | sed 's/^/fuzz: input: /' >&2
        exit "$rc"
    fi
}

case $mode in
    smoke)
        secs=${FUZZ_SMOKE_SECONDS:-30}
        scratch=$out/smoke-corpus
        rm -rf "$scratch" && mkdir -p "$scratch"
        n=$(find "$seeds" -type f | wc -l)
        echo "fuzz: smoke run: $n seed inputs replayed, then new inputs until ${secs}s (seed ${FUZZ_SEED:-1})"
        run -seed="${FUZZ_SEED:-1}" -max_total_time="$secs" "$scratch" "$seeds"
        echo "fuzz: smoke run passed"
        ;;
    long)
        secs=${FUZZ_SECONDS:-600}
        mkdir -p "$out/corpus"
        echo "fuzz: long run: ${secs}s from $seeds and $out/corpus (log: $log)"
        run -max_total_time="$secs" "$out/corpus" "$seeds"
        echo "fuzz: long run passed; \`scripts/fuzz.sh merge\` adds what it found to $seeds"
        ;;
    merge)
        [ -d "$out/corpus" ] || { echo "fuzz: nothing to merge: no $out/corpus (run \`make fuzz\` first)" >&2; exit 1; }
        before=$(find "$seeds" -type f | wc -l)
        run -set_cover_merge=1 "$seeds" "$out/corpus"
        echo "fuzz: $seeds: $before -> $(find "$seeds" -type f | wc -l) inputs"
        ;;
    rebuild)
        [ -d "$out/corpus" ] || { echo "fuzz: nothing to rebuild from: no $out/corpus (run \`make fuzz\` first)" >&2; exit 1; }
        before=$(find "$seeds" -type f | wc -l)
        fresh=$out/rebuilt-corpus
        rm -rf "$fresh" && mkdir -p "$fresh"
        run -set_cover_merge=1 "$fresh" "$seeds" "$out/corpus"
        rm -rf "$seeds" && mv "$fresh" "$seeds"
        echo "fuzz: $seeds rebuilt: $before -> $(find "$seeds" -type f | wc -l) inputs"
        ;;
    *)
        echo "usage: $0 smoke|long|merge|rebuild" >&2
        exit 2
        ;;
esac
