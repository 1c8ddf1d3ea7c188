#!/usr/bin/env bash
# Every public header compiles on its own, as strict C11 and as C++, and speaks C only: the headers are
# generated from Rust doc comments, and nothing of Rust (item paths, intra-doc links, Rust types) may leak into
# what a C user reads.
# usage: check-headers.sh INCLUDE_DIR
set -euo pipefail

dir=$1
CC=${CC:-cc}
CXX=${CXX:-c++}
verbs_cflags=$(pkg-config --cflags libibverbs 2>/dev/null || true)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

shopt -s nullglob
headers=("$dir"/*.h)
if [ ${#headers[@]} -eq 0 ]; then
    echo "check-headers: no headers in $dir" >&2
    exit 1
fi

failed=0
for h in "${headers[@]}"; do
    name=$(basename "$h")
    printf '#include <%s>\n#include <%s>\nint main(void) { return 0; }\n' "$name" "$name" > "$work/tu.c"
    cp "$work/tu.c" "$work/tu.cpp"
    # shellcheck disable=SC2086
    if $CC -std=c11 -Wall -Wextra -Wpedantic -Werror -I"$dir" $verbs_cflags -c "$work/tu.c" -o "$work/tu.o"; then
        echo "PASS $name compiles as C11"
    else
        echo "FAIL $name does not compile as C11"; failed=1
    fi
    # shellcheck disable=SC2086
    if $CXX -Wall -Wextra -Werror -I"$dir" $verbs_cflags -c "$work/tu.cpp" -o "$work/tu.o"; then
        echo "PASS $name compiles as C++"
    else
        echo "FAIL $name does not compile as C++"; failed=1
    fi
done
# Rust-only text: a path (`Queue::check_free`), an intra-doc link ([`Queue`]), a Rust type or keyword, or
# the word itself. Each pattern with what it catches, for the message.
rust_only=(
    '::|an item path'
    '\[`|an intra-doc link'
    '\b(Option|Result|Box|Rc|Arc|Vec|RefCell|Cell|Pin|NonNull)<|a Rust generic type'
    '&mut\b|&self\b|a Rust reference'
    '\b(Self|impl|unsafe|None)\b|\b(Some|Ok|Err)\(|a Rust keyword or variant'
    '\bRust\b|the word Rust'
)
for h in "${headers[@]}"; do
    name=$(basename "$h")
    found=0
    for entry in "${rust_only[@]}"; do
        pattern=${entry%|*} what=${entry##*|}
        if grep -nE -- "$pattern" "$h" > "$work/hits"; then
            while IFS= read -r hit; do
                echo "FAIL $name:${hit%%:*}: $what in a C header: ${hit#*:}"
            done < "$work/hits"
            found=1
        fi
    done
    if [ $found -eq 0 ]; then
        echo "PASS $name names nothing of Rust"
    else
        failed=1
    fi
done
exit $failed
