#!/usr/bin/env bash
# The libraries export exactly the C API, every function under the version node the export map gives it.
#
# Three lists must agree, name for name: the functions the export map (src/capi/sqdisc.map) names, the
# sqd_* functions the public headers declare, and the functions each library exports (the shared library's
# dynamic symbols, the static archive's global ones). Then every dynamic symbol of the shared library must
# carry its map node as its version: the node that names it last is its default version (name@@NODE), an
# earlier node naming it too is an older version kept for binaries linked against it (name@NODE).
# libsqdisc's headers are INCLUDE_DIR/*.h but those of the other libraries; --header NAME (repeatable) checks a
# library whose headers are only those (libsqdisc_sim: --map sim/sqdisc_sim.map --header sqdisc_sim.h).
# usage: check-symbols.sh [--soname NAME] [--map MAP] [--header NAME]... SHARED_LIB STATIC_LIB INCLUDE_DIR
set -euo pipefail

soname=
headers=()
map="$(cd "$(dirname "$0")/.." && pwd)/src/capi/sqdisc.map"
while [ $# -gt 3 ]; do
    case $1 in
        --soname) soname=$2; shift 2 ;;
        --map) map=$2; shift 2 ;;
        --header) headers+=("$2"); shift 2 ;;
        *) echo "usage: $0 [--soname NAME] [--map MAP] [--header NAME]... SHARED_LIB STATIC_LIB INCLUDE_DIR" >&2; exit 2 ;;
    esac
done
so=$1 archive=$2 incdir=$3
CC=${CC:-cc}
NM=${NM:-nm}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL $*"; failed=1; }

# ---- the export map: one "name node" line per global entry, in file order ----------------------------------
# Comments go first; then each `NODE {` opens a node, `global:`/`local:` switch sections, `} [PARENT];` closes.
sed -e ':a' -e '/\/\*/{ /\*\//!{ N; ba' -e '}; }' -e 's|/\*.*\*/||g' "$map" | tr ';' '\n' | awk -v map="$map" '
    { gsub(/^[ \t]+|[ \t]+$/, "") }
    $0 == "" { next }
    /^[A-Za-z0-9_.]+[ \t]*\{$/ { sub(/[ \t]*\{$/, ""); node = $0; section = "global"; nodes[++n] = node; next }
    /^}/ { node = ""; next }
    /^global:/ { section = "global"; sub(/^global:[ \t]*/, "") }
    /^local:/ { section = "local"; sub(/^local:[ \t]*/, "") }
    $0 == "" { next }
    node == "" { print "ERROR text outside a version node: " $0; next }
    section == "global" { print $0, node }
    section == "local" && $0 != "*" { print "ERROR a local entry other than *: " $0 " in " node }
    END { if (n == 0) print "ERROR no version node in " map }
' > "$work/map-entries"
if grep '^ERROR ' "$work/map-entries" | sed "s|^ERROR |FAIL $map: |"; then failed=1; fi
grep -v '^ERROR ' "$work/map-entries" > "$work/map-lines" || true
# A pattern would make any future function of that name ABI without anyone deciding it.
awk '$1 ~ /[][*?]/ { print $1 " (in " $2 ")" }' "$work/map-lines" | while read -r entry; do
    echo "FAIL $map: a pattern, not a name: $entry (name each exported function)"
done > "$work/map-bad"
if [ -s "$work/map-bad" ]; then cat "$work/map-bad"; failed=1; fi
# The same name twice in one node is a typo.
sort "$work/map-lines" | uniq -d | while read -r name node; do
    echo "FAIL $map: $name is listed twice in $node"
done > "$work/map-dup"
if [ -s "$work/map-dup" ]; then cat "$work/map-dup"; failed=1; fi
awk '{ print $1 }' "$work/map-lines" | sort -u > "$work/map"
# What each exported name's dynamic symbols must be: name@@NODE for the last node naming it, name@NODE for
# the earlier ones.
awk '{ last[$1] = $2; all[$1] = all[$1] " " $2 }
     END { for (s in all) { k = split(all[s], v, " "); for (i = 1; i <= k; i++)
               print s (v[i] == last[s] ? "@@" : "@") v[i] } }' "$work/map-lines" | sort -u > "$work/map-versions"

# ---- the headers -----------------------------------------------------------------------------------------
# Functions the headers declare: the preprocessed text (comments gone) has `sqd_name(` for each
# declaration; pointer typedefs read `(*sqd_name)(` and do not match.
verbs_cflags=$(pkg-config --cflags libibverbs 2>/dev/null || true)
for h in "$incdir"/*.h; do
    if [ ${#headers[@]} -gt 0 ]; then
        case " ${headers[*]} " in *" $(basename "$h") "*) ;; *) continue ;; esac
    else
        # libsqdisc_sim's, libsqdisc_spdk's and libsqdisc_check's headers belong to those libraries (checked with
        # --header sqdisc_sim.h, scripts/check-spdk-symbols.sh, scripts/check-checker-symbols.sh).
        case $(basename "$h") in sqdisc_sim.h | sqdisc_spdk.h | sqdisc_check.h) continue ;; esac
    fi
    if [ ${#headers[@]} -gt 0 ]; then
        # Only this header's own declarations: not those of the <sqdisc.h> it includes (preprocessing needs
        # no types).
        # shellcheck disable=SC2086
        grep -v '^#include <sqdisc.h>' "$h" | "$CC" -E -P -I"$incdir" $verbs_cflags -x c -
    else
        # shellcheck disable=SC2086
        "$CC" -E -P -I"$incdir" $verbs_cflags -x c "$h"
    fi
done | grep -oE '\bsqd_[A-Za-z0-9_]+[[:space:]]*\(' | sed 's/[[:space:]]*($//' | sort -u > "$work/header"
if [ ! -s "$work/header" ]; then
    fail "no sqd_* function declared in $incdir/*.h"
fi

# ---- the shared library ----------------------------------------------------------------------------------
# Every dynamic symbol it defines must be a function of the map (the version nodes themselves are absolute
# symbols, not code).
: > "$work/so"
: > "$work/so-versions"
while read -r _addr type name; do
    base=${name%%@*}
    if [ "$type" = A ] && grep -qx -- "$base" <(awk '{ print $2 }' "$work/map-lines"); then continue; fi
    if [ "$type" = T ] && [[ $base == sqd_* ]]; then
        echo "$base" >> "$work/so"
        echo "$name" >> "$work/so-versions"
    else
        fail "$so exports $name (type $type): only the map's sqd_* functions may leave the library"
    fi
done < <("$NM" -D --defined-only --with-symbol-versions "$so")
sort -u -o "$work/so" "$work/so"
sort -u -o "$work/so-versions" "$work/so-versions"
# Unversioned exports (no @ at all) mean the map was not applied.
{ grep -v '@' "$work/so-versions" || true; } | while read -r name; do
    echo "FAIL $so exports $name without a version: was it linked with --version-script=src/capi/sqdisc.map?"
done > "$work/so-unversioned"
if [ -s "$work/so-unversioned" ]; then cat "$work/so-unversioned"; failed=1; fi

# ---- the static library ----------------------------------------------------------------------------------
# No global definition outside the map's functions, so a C program linking it sees nothing of Rust's.
"$NM" -g --defined-only "$archive" | awk 'NF == 3 { print $2, $3 }' > "$work/a-all"
awk '$2 !~ /^sqd_[A-Za-z0-9_]+$/' "$work/a-all" | while read -r type name; do
    echo "FAIL $archive defines the global symbol $name (type $type): only the map's sqd_* functions may be global"
done > "$work/a-bad"
if [ -s "$work/a-bad" ]; then cat "$work/a-bad"; failed=1; fi
awk '$1 == "T" && $2 ~ /^sqd_[A-Za-z0-9_]+$/ { print $2 }' "$work/a-all" | sort -u > "$work/a"

# ---- the comparisons -------------------------------------------------------------------------------------
differ() { # description-of-A file-A description-of-B file-B
    local only
    only=$(comm -23 "$2" "$4" | tr '\n' ' ')
    [ -z "$only" ] || fail "in $1 but not in $3: $only"
}
differ "the map" "$work/map" "the headers" "$work/header"
differ "the headers" "$work/header" "the map" "$work/map"
for lib in so a; do
    name=$so
    [ $lib = a ] && name=$archive
    differ "the map" "$work/map" "$name's exports" "$work/$lib"
    differ "$name's exports" "$work/$lib" "the map" "$work/map"
done
if [ -s "$work/so-versions" ]; then
    only=$(comm -23 "$work/map-versions" "$work/so-versions" | tr '\n' ' ')
    [ -z "$only" ] || fail "$so lacks these versioned symbols the map defines: $only"
    only=$(comm -13 "$work/map-versions" "$work/so-versions" | tr '\n' ' ')
    [ -z "$only" ] || fail "$so exports these symbols under a version the map does not give them: $only"
fi

if [ -n "$soname" ]; then
    actual=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ "$actual" = "$soname" ] || fail "$so has soname '$actual', expected '$soname'"
fi

if [ $failed -eq 0 ]; then
    nodes=$(awk '{ print $2 }' "$work/map-lines" | awk '!seen[$0]++' | tr '\n' ' ')
    echo "PASS exported symbols of $so and $archive: $(wc -l < "$work/header") sqd_* functions, as declared in" \
        "$incdir and named in $map, each under its version node (${nodes% })"
fi
exit $failed
