#!/usr/bin/env bash
# libsqdisc_spdk exports exactly SPDK's 14 provider functions and the three sqd_spdk_* functions of
# sqdisc_spdk.h, and needs from SPDK exactly the functions every SPDK release since v25.05 exports; SPDK's
# connection-manager wrappers (master only) are weak references, librdmacm the fallback.
# usage: check-spdk-symbols.sh SHARED_LIB STATIC_LIB SONAME
set -euo pipefail
so=$1 archive=$2 soname=$3
NM=${NM:-nm}
failed=0
fail() { echo "FAIL $*"; failed=1; }

expected_exports=$(printf '%s\n' \
    spdk_rdma_provider_srq_create spdk_rdma_provider_srq_destroy spdk_rdma_provider_srq_queue_recv_wrs \
    spdk_rdma_provider_srq_flush_recv_wrs spdk_rdma_provider_qp_create spdk_rdma_provider_qp_accept \
    spdk_rdma_provider_qp_complete_connect spdk_rdma_provider_qp_destroy spdk_rdma_provider_qp_disconnect \
    spdk_rdma_provider_qp_queue_send_wrs spdk_rdma_provider_qp_flush_send_wrs \
    spdk_rdma_provider_qp_queue_recv_wrs spdk_rdma_provider_qp_flush_recv_wrs \
    spdk_rdma_provider_accel_sequence_supported sqd_spdk_qp_stats sqd_spdk_cq_stats sqd_spdk_qp_counters | sort)
# Strong imports: every SPDK release since v25.05 exports them (libspdk_log, libspdk_rdma_utils). Weak ones:
# SPDK's connection-manager wrappers, which only SPDK master has; without them librdmacm is called directly.
expected_imports=$(printf '%s\n' spdk_log spdk_rdma_utils_get_memory_domain spdk_rdma_utils_put_memory_domain | sort)
expected_weak=$(printf '%s\n' spdk_rdma_cm_accept spdk_rdma_cm_create_qp spdk_rdma_cm_destroy_qp \
    spdk_rdma_cm_disconnect | sort)
expected_rdmacm=$(printf '%s\n' rdma_accept rdma_create_qp rdma_destroy_qp rdma_disconnect | sort)

so_exports=$("$NM" -D --defined-only "$so" | awk '{ sub(/@.*/, "", $3); print $2, $3 }')
bad=$(awk '$1 != "T"' <<<"$so_exports")
[ -z "$bad" ] || fail "$so exports something other than functions: $bad"
[ "$(awk '{ print $2 }' <<<"$so_exports" | sort)" = "$expected_exports" ] \
    || fail "$so exports: $(awk '{ print $2 }' <<<"$so_exports" | sort | tr '\n' ' '), expected: $(tr '\n' ' ' <<<"$expected_exports")"

undefined() { # nm-options... kind: the undefined symbols of that kind (U strong, w weak), versions cut
    local kind=${*: -1}
    "$NM" "${@:1:$#-1}" | awk -v k="$kind" '$1 == k { sub(/@.*/, "", $2); print $2 }' | sort -u
}
for lib in "$so" "$archive"; do
    opts=(--undefined-only)
    [ "$lib" = "$so" ] && opts=(-D --undefined-only)
    imports=$(undefined "${opts[@]}" "$lib" U | grep '^spdk_' || true)
    [ "$imports" = "$expected_imports" ] \
        || fail "$lib needs from SPDK: $(tr '\n' ' ' <<<"$imports"), expected: $(tr '\n' ' ' <<<"$expected_imports")"
    weak=$(undefined "${opts[@]}" "$lib" w | grep '^spdk_' || true)
    [ "$weak" = "$expected_weak" ] \
        || fail "$lib refers weakly to: $(tr '\n' ' ' <<<"$weak"), expected: $(tr '\n' ' ' <<<"$expected_weak")"
    rdmacm=$(undefined "${opts[@]}" "$lib" U | grep '^rdma_' || true)
    [ "$rdmacm" = "$expected_rdmacm" ] \
        || fail "$lib needs from librdmacm: $(tr '\n' ' ' <<<"$rdmacm"), expected: $(tr '\n' ' ' <<<"$expected_rdmacm")"
done
readelf -d "$so" | grep -q 'Shared library: \[librdmacm' || fail "$so does not name librdmacm among its dependencies"

got_soname=$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$got_soname" = "$soname" ] || fail "$so has soname '$got_soname', expected $soname"

a_globals=$("$NM" -g --defined-only "$archive" | awk 'NF == 3 { print $3 }' | sort)
[ "$a_globals" = "$expected_exports" ] \
    || fail "$archive defines the globals: $(tr '\n' ' ' <<<"$a_globals"), expected: $(tr '\n' ' ' <<<"$expected_exports")"

if [ "$failed" -ne 0 ]; then exit 1; fi
echo "check-spdk-symbols: $so ($soname) and $archive export the 14 provider functions and 3 sqd_spdk_* functions; $(wc -l <<<"$expected_imports") functions come from SPDK, $(wc -l <<<"$expected_weak") from SPDK if it has them (weak), else from librdmacm"
