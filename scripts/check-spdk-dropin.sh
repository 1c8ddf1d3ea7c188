#!/usr/bin/env bash
# libsqdisc_spdk in every SPDK release of spdk/releases/ (v25.05, v25.09, v26.01, v26.05, master), in each of
# the three ways docs/spdk.md gives: replacing SPDK's provider library (a file named as that release's soname,
# first on the library path), preloaded (LD_PRELOAD), and its archive linked in the place of SPDK's in a
# static build (every archive inside --whole-archive).
#
# For each release a stand-in of SPDK is built from the release's facts (spdk/releases/<release>/): one
# library (shared, and an archive) per map of exports.txt, exporting exactly that map's symbols; the provider
# library has the release's soname. The few functions a provider calls have behaviour
# (c-tests/spdk-dropin/standin/<map>.c, fake_provider.c for SPDK's own provider); every other export is a stub.
# A program linked as SPDK's applications are (c-tests/spdk-dropin/app.c) drives a qpair through whichever
# provider it reaches, on the software HCA, and prints the provider and every call into SPDK or librdmacm.
# As built it must reach SPDK's provider; replaced, preloaded or statically replaced, sqdisc's; both making
# the same calls, through spdk_rdma_cm_* where the release has them and librdmacm where it has not.
# A symbol libsqdisc_spdk needs that a release does not export fails the check by name.
# usage: check-spdk-dropin.sh STAGE_DIR LIBDIR_IN_STAGE [RELEASE...]
set -euo pipefail
stage=$1 libdir=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/c-tests/spdk-dropin
out=$root/build/spdk-dropin
CC=${CC:-cc}
NM=${NM:-nm}
stage_lib=$stage$libdir
pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage_lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
read -r -a cflags <<< "$(pc --cflags sqdisc_spdk sqdisc sqdisc_sim)"
# libsqdisc is named as needed by the program itself (--no-as-needed), so the run path below finds it: a
# DT_RUNPATH serves only the program's own dependencies, not libsqdisc_sim's.
read -r -a sim_libs <<< "-Wl,--no-as-needed $(pc --libs sqdisc sqdisc_sim) -Wl,-rpath,$stage_lib"
read -r -a static_deps <<< "$(pc --static --libs-only-l sqdisc_spdk | sed 's/-lsqdisc_spdk//')"
sqdisc_so=$stage_lib/libsqdisc_spdk.so.0
sqdisc_a=$stage_lib/libsqdisc_spdk.a
if [ $# -gt 0 ]; then releases=("$@"); else
    mapfile -t releases < <(cd "$root/spdk/releases" && ls -d -- */ | tr -d /)
fi
failed=0
fail() { echo "FAIL spdk-dropin $*"; failed=1; }

# What libsqdisc_spdk needs from SPDK at load (shared) or link (archive) time: its strong undefined spdk_*
# symbols. Weak ones (spdk_rdma_cm_*) may be absent.
strong_imports() { "$NM" "$@" | awk '$1 == "U" && $2 ~ /^spdk_/ { sub(/@.*/, "", $2); print $2 }' | sort -u; }
so_needs=$(strong_imports -D --undefined-only "$sqdisc_so")
a_needs=$(strong_imports --undefined-only "$sqdisc_a")

# Builds, into directory $1, the stand-in of map $2 (library $3, file $4) exporting exactly the symbols $5:
# the behaviour in file $6 (compiled with the flags that follow) and a stub for every other symbol.
build_library() {
    local c=$1 m=$2 lib=$3 so_file=$4 syms=$5 behaviour=$6 defined= extra stubs objs=()
    shift 6
    rm -rf "$c" && mkdir -p "$c"
    if [ -n "$behaviour" ]; then
        "$CC" -std=c11 -Wall -Werror -fPIC -c "${cflags[@]}" "$@" "$behaviour" -o "$c/behaviour.o" || return 1
        objs+=("$c/behaviour.o")
        defined=$("$NM" -g --defined-only "$c/behaviour.o" | awk 'NF == 3 { print $3 }' | sort)
        extra=$(comm -23 <(echo "$defined") <(sort <<< "$syms"))
        [ -z "$extra" ] || { echo "error: $behaviour defines $extra, which $m does not export here" >&2; return 1; }
    fi
    stubs=$(comm -23 <(sort <<< "$syms") <(echo "$defined") | sed '/^$/d')
    if [ -n "$stubs" ]; then
        awk '{ printf "void %s(void);\nvoid %s(void) {}\n", $1, $1 }' <<< "$stubs" > "$c/stubs.c"
        "$CC" -w -fPIC -c "$c/stubs.c" -o "$c/stubs.o" || return 1
        objs+=("$c/stubs.o")
    fi
    { echo '{ global:'; sed 's/$/;/' <<< "$syms"; echo 'local: *; };'; } > "$c/exports.ver"
    "$CC" -shared -o "$c/$so_file" "${objs[@]}" -Wl,-soname,"$so_file" -Wl,--version-script,"$c/exports.ver" \
        -lrdmacm -libverbs || return 1
    [ "$so_file" = "$lib.so" ] || ln -sfn "$so_file" "$c/$lib.so"
    ar rcs "$c/$lib.a" "${objs[@]}" || return 1
    # Exactly the release's exports, no more, no fewer.
    if [ "$("$NM" -D --defined-only "$c/$so_file" | awk '{ print $3 }' | sort)" != "$(sort <<< "$syms")" ]; then
        echo "error: the stand-in $so_file does not export exactly $m's symbols" >&2
        return 1
    fi
    touch "$c/done"
}

# Builds the stand-in of release $1 into $out/$1: lib/ (shared), static/ (archives), app-shared, app-static.
build_standin() {
    local r=$1 d=$out/$1 exports=$root/spdk/releases/$1/exports.txt
    local soname m lib syms behaviour so_file key c flags libs=()
    soname=$(sed -n 's/^rdma_provider_soname //p' "$root/spdk/releases/$r/VERSION")
    rm -rf "$d" && mkdir -p "$d"/{lib,static,replaced,replaced-static}
    for m in $(awk '{ print $1 }' "$exports" | sort -u); do
        lib=libspdk_${m#spdk_}
        libs+=("-l${lib#lib}")
        syms=$(awk -v m="$m" '$1 == m { print $2 }' "$exports")
        behaviour= flags=()
        if [ "$m" = spdk_rdma_provider ]; then
            behaviour=$src/fake_provider.c
            grep -qx 'spdk_rdma_cm spdk_rdma_cm_create_qp' "$exports" && flags=(-DSTANDIN_SPDK_RDMA_CM)
        elif [ -f "$src/standin/$m.c" ]; then
            behaviour=$src/standin/$m.c
        fi
        so_file=$lib.so
        [ "$m" = spdk_rdma_provider ] && so_file=$soname
        # Most libraries are the same in several releases: each distinct one is built once.
        key=$({ echo "$so_file ${flags[*]}"; echo "$syms"; cat ${behaviour:+"$behaviour"} "$0"; } | sha1sum | cut -c1-20)
        c=$out/cache/$key
        if [ ! -f "$c/done" ]; then
            build_library "$c" "$m" "$lib" "$so_file" "$syms" "$behaviour" "${flags[@]}" || return 1
        fi
        cp -P "$c"/*.so* "$d/lib/" && cp "$c/$lib.a" "$d/static/"
    done
    # Linked as SPDK's applications are: against every library by soname, or every archive in --whole-archive.
    "$CC" -std=c11 -Wall -Werror "${cflags[@]}" "$src/app.c" -rdynamic -L"$d/lib" -Wl,--no-as-needed "${libs[@]}" \
        -Wl,--as-needed "${sim_libs[@]}" -lrdmacm -libverbs -o "$d/app-shared" || return 1
    ln -sfn "$sqdisc_so" "$d/replaced/$soname"
    cp "$d"/static/*.a "$d/replaced-static/"
    cp "$sqdisc_a" "$d/replaced-static/libspdk_rdma_provider.a"
    printf '%s\n' "${libs[@]}" > "$d/libs"
    link_static "$d" static || return 1
}

# Links $1/app-$2 from the archives of $1/$2, as SPDK's static build links its applications.
link_static() {
    local libs
    mapfile -t libs < "$1/libs"
    "$CC" -std=c11 -Wall -Werror "${cflags[@]}" "$src/app.c" -L"$1/$2" -Wl,--whole-archive "${libs[@]}" \
        -Wl,--no-whole-archive "${sim_libs[@]}" "${static_deps[@]}" -lrdmacm -libverbs -o "$1/app-$2"
}

expect() { # release mode expected command...
    local r=$1 mode=$2 want=$3 got
    shift 3
    got=$("$@" 2>&1) || true
    if [ "$got" = "$want" ]; then echo "PASS spdk-dropin $r $mode: ${want%% *}'s provider,${want#* }"
    else fail "$r $mode: expected: $want"$'\n'"    got: $got"; fi
}

for r in "${releases[@]}"; do
    exports=$root/spdk/releases/$r/exports.txt
    [ -f "$exports" ] || { fail "$r: no spdk/releases/$r/exports.txt"; continue; }
    for s in $so_needs; do
        awk -v s="$s" '$2 == s { found = 1 } END { exit !found }' "$exports" \
            || fail "$r: $(basename "$sqdisc_so") needs $s, which no library of SPDK $r exports"
    done
    for s in $a_needs; do
        awk -v s="$s" '$2 == s { found = 1 } END { exit !found }' "$exports" \
            || fail "$r: $(basename "$sqdisc_a") needs $s, which no archive of SPDK $r defines"
    done
    build_standin "$r" || { fail "$r: building the stand-in failed"; continue; }
    d=$out/$r
    # What SPDK's provider of this release calls, in order; the drop-in must make the same calls.
    if grep -qx 'spdk_rdma_cm spdk_rdma_cm_create_qp' "$exports"; then
        calls=" spdk_rdma_cm_create_qp rdma_create_qp spdk_rdma_utils_get_memory_domain spdk_rdma_cm_accept rdma_accept"
        calls+=" spdk_rdma_cm_disconnect rdma_disconnect spdk_rdma_cm_destroy_qp rdma_destroy_qp spdk_rdma_utils_put_memory_domain"
    else
        calls=" rdma_create_qp spdk_rdma_utils_get_memory_domain rdma_accept rdma_disconnect rdma_destroy_qp"
        calls+=" spdk_rdma_utils_put_memory_domain"
    fi
    soname=$(sed -n 's/^rdma_provider_soname //p' "$root/spdk/releases/$r/VERSION")
    expect "$r" "shared ($soname), as built" "spdk$calls" env LD_LIBRARY_PATH="$d/lib" "$d/app-shared"
    expect "$r" "shared, preloaded" "sqdisc$calls" env LD_LIBRARY_PATH="$d/lib" LD_PRELOAD="$sqdisc_so" "$d/app-shared"
    expect "$r" "shared, $soname replaced" "sqdisc$calls" env LD_LIBRARY_PATH="$d/replaced:$d/lib" "$d/app-shared"
    expect "$r" "static, as built" "spdk$calls" env -u LD_LIBRARY_PATH "$d/app-static"
    if link_log=$(link_static "$d" replaced-static 2>&1); then
        expect "$r" "static, archive replaced" "sqdisc$calls" env -u LD_LIBRARY_PATH "$d/app-replaced-static"
    else
        fail "$r static, archive replaced: the link failed:"$'\n'"$(grep -E 'undefined reference|error' <<< "$link_log" | sort -u)"
    fi
done
[ "$failed" -eq 0 ] && echo "check-spdk-dropin: ${releases[*]}: every mode reached the expected provider"
exit "$failed"
