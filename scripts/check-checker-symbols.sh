#!/usr/bin/env bash
# libsqdisc_check exports exactly the 11 libibverbs functions it interposes and the sqd_check_* functions that
# sqdisc_check.h declares, nothing of the sqdisc core, and has its soname.
# usage: check-checker-symbols.sh SHARED_LIB SONAME HEADER
set -euo pipefail
so=$1 soname=$2 header=$3
NM=${NM:-nm}
failed=0
fail() { echo "FAIL $*"; failed=1; }

declared=$(sed -n 's/^[a-z].*[ *]\(sqd_check_[a-z_]*\)(.*/\1/p' "$header" | sort)
[ -n "$declared" ] || fail "$header declares no sqd_check_* function"
expected=$( (printf '%s\n' ibv_create_cq ibv_resize_cq ibv_destroy_cq ibv_create_qp ibv_modify_qp ibv_destroy_qp \
    ibv_reg_mr ibv_reg_mr_iova ibv_reg_mr_iova2 ibv_reg_dmabuf_mr ibv_dereg_mr; echo "$declared") | sort)

exports=$("$NM" -D --defined-only "$so" | awk '{ sub(/@.*/, "", $3); print $2, $3 }')
bad=$(awk '$1 != "T"' <<<"$exports")
[ -z "$bad" ] || fail "$so exports something other than functions: $bad"
[ "$(awk '{ print $2 }' <<<"$exports" | sort)" = "$expected" ] \
    || fail "$so exports: $(awk '{ print $2 }' <<<"$exports" | sort | tr '\n' ' '), expected: $(tr '\n' ' ' <<<"$expected")"
if "$NM" -D --undefined-only "$so" | grep -q ' sqd_'; then
    fail "$so needs sqd_* symbols (the sqdisc core): $("$NM" -D --undefined-only "$so" | grep ' sqd_' | tr '\n' ' ')"
fi
got_soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$got_soname" = "$soname" ] || fail "$so has soname '$got_soname', expected $soname"
if readelf -d "$so" | grep -q 'NEEDED.*libsqdisc\.so'; then fail "$so needs libsqdisc.so"; fi

# The header stands alone in C11 and C++11, with every warning an error.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <sqdisc_check.h>\nint main(void) { return (int)sqd_check_count(0); }\n' > "$probe/h.c"
cp "$probe/h.c" "$probe/h.cc"
${CC:-cc} -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$(dirname "$header")" "$probe/h.c" \
    || fail "$header does not compile alone as C11"
${CXX:-c++} -std=c++11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$(dirname "$header")" "$probe/h.cc" \
    || fail "$header does not compile alone as C++11"

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "check-checker-symbols: $so ($soname) exports the 11 interposed libibverbs functions and $(wc -l <<<"$declared") sqd_check_* functions, nothing else; the header compiles alone as C11 and C++11"
