#!/usr/bin/env bash
# The libraries export exactly the C API: the sqd_* functions that the public headers declare, nothing else.
# usage: check-symbols.sh [--soname NAME] SHARED_LIB STATIC_LIB INCLUDE_DIR
set -euo pipefail

soname=
if [ "${1:-}" = --soname ]; then soname=$2; shift 2; fi
so=$1 archive=$2 incdir=$3
CC=${CC:-cc}
NM=${NM:-nm}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL $*"; failed=1; }

# Functions the headers declare: the preprocessed text (comments gone) has `sqd_name(` for each
# declaration; pointer typedefs read `(*sqd_name)(` and do not match.
verbs_cflags=$(pkg-config --cflags libibverbs 2>/dev/null || true)
for h in "$incdir"/*.h; do
    # libsqdisc_spdk's and libsqdisc_check's headers belong to those libraries (scripts/check-spdk-symbols.sh,
    # scripts/check-checker-symbols.sh).
    case $(basename "$h") in sqdisc_spdk.h | sqdisc_check.h) continue ;; esac
    # shellcheck disable=SC2086
    "$CC" -E -P -I"$incdir" $verbs_cflags -x c "$h"
done | grep -oE '\bsqd_[A-Za-z0-9_]+[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u > "$work/header"
if [ ! -s "$work/header" ]; then
    fail "no sqd_* function declared in $incdir/*.h"
fi

# The shared library: every dynamic symbol it defines must be an sqd_* function (the version node
# SQDISC_* that the export map creates is an absolute symbol, not code).
: > "$work/so"
while read -r _addr type name; do
    name=${name%%@*}
    if [ "$type" = A ] && [[ $name == SQDISC_* ]]; then continue; fi
    if [[ $name == sqd_* ]] && [ "$type" = T ]; then
        echo "$name" >> "$work/so"
    else
        fail "$so exports $name (type $type): only sqd_* functions may leave the library"
    fi
done < <("$NM" -D --defined-only "$so")
sort -u -o "$work/so" "$work/so"

# The static library: no global definition outside sqd_*, so a C program linking it sees nothing of Rust's.
"$NM" -g --defined-only "$archive" | awk 'NF == 3 { print $2, $3 }' > "$work/a-all"
awk '$2 !~ /^sqd_/' "$work/a-all" | while read -r type name; do
    echo "FAIL $archive defines the global symbol $name (type $type): only sqd_* may be global"
done > "$work/a-bad"
if [ -s "$work/a-bad" ]; then cat "$work/a-bad"; failed=1; fi
awk '$1 == "T" && $2 ~ /^sqd_/ { print $2 }' "$work/a-all" | sort -u > "$work/a"

compare() { # name-of-library file
    local extra missing
    extra=$(comm -13 "$work/header" "$2" | tr '\n' ' ')
    missing=$(comm -23 "$work/header" "$2" | tr '\n' ' ')
    [ -z "$extra" ] || fail "$1 exports functions no header declares: $extra(add them to the C API and run \`make header\`)"
    [ -z "$missing" ] || fail "$1 lacks functions the headers declare: $missing"
}
compare "$so" "$work/so"
compare "$archive" "$work/a"

if [ -n "$soname" ]; then
    actual=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ "$actual" = "$soname" ] || fail "$so has soname '$actual', expected '$soname'"
fi

if [ $failed -eq 0 ]; then
    echo "PASS exported symbols of $so and $archive: $(wc -l < "$work/header") sqd_* functions, as declared in $incdir"
fi
exit $failed
