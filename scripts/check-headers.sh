#!/usr/bin/env bash
# Every public header compiles on its own, as strict C11 and as C++.
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
exit $failed
