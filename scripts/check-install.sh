#!/usr/bin/env bash
# `make install` puts exactly the expected files where PREFIX/LIBDIR/INCLUDEDIR/PKGCONFIGDIR say, under DESTDIR
# (which never leaks into sqdisc.pc), and `make uninstall` with the same variables leaves nothing of ours.
# usage: check-install.sh [MAKE]
set -euo pipefail

make_cmd=${1:-make}
# Test the defaults, not whatever variables the calling make was given.
unset MAKEFLAGS MFLAGS MAKEOVERRIDES
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=$(awk -F'"' '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { print $2; exit }' Cargo.toml)
major=${version%%.*}
spdk_version=$(awk -F'"' '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { print $2; exit }' spdk/Cargo.toml)
spdk_major=${spdk_version%%.*}
check_version=$(awk -F'"' '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { print $2; exit }' check/Cargo.toml)
check_major=${check_version%%.*}
sim_version=$(awk -F'"' '/^\[/ { pkg = ($0 == "[package]") } pkg && /^version *=/ { print $2; exit }' sim/Cargo.toml)
sim_major=${sim_version%%.*}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

round_trip() { # label prefix libdir includedir pkgconfigdir [extra make variables...]
    local label=$1 prefix=$2 libdir=$3 includedir=$4 pcdir=$5; shift 5
    local dest=$work/$label
    mkdir -p "$dest"
    if ! $make_cmd --no-print-directory -s install DESTDIR="$dest" "$@" > "$work/$label.log" 2>&1; then
        sed 's/^/    | /' "$work/$label.log" | tail -n 30
        fail "install ($label): make install failed"; return
    fi

    local expected=(
        "$libdir/libsqdisc.so.$version"
        "$libdir/libsqdisc.so.$major"
        "$libdir/libsqdisc.so"
        "$libdir/libsqdisc.a"
        "$pcdir/sqdisc.pc"
        "$libdir/libsqdisc_sim.so.$sim_version"
        "$libdir/libsqdisc_sim.so.$sim_major"
        "$libdir/libsqdisc_sim.so"
        "$libdir/libsqdisc_sim.a"
        "$pcdir/sqdisc_sim.pc"
        "$libdir/libsqdisc_spdk.so.$spdk_version"
        "$libdir/libsqdisc_spdk.so.$spdk_major"
        "$libdir/libsqdisc_spdk.so"
        "$libdir/libsqdisc_spdk.a"
        "$includedir/sqdisc_spdk.h"
        "$pcdir/sqdisc_spdk.pc"
        "$libdir/libsqdisc_check.so.$check_version"
        "$libdir/libsqdisc_check.so.$check_major"
        "$libdir/libsqdisc_check.so"
        "$includedir/sqdisc_check.h"
        "$pcdir/sqdisc_check.pc"
        "$prefix/bin/sqdisc-sim"
        "$libdir/libsqdisc_sim_preload.so"
    )
    for h in include/*.h; do expected+=("$includedir/$(basename "$h")"); done
    printf '%s\n' "${expected[@]}" | sort > "$work/$label.expected"
    (cd "$dest" && find . ! -type d | sed 's|^\.||' | sort) > "$work/$label.found"
    if diff -u "$work/$label.expected" "$work/$label.found" > "$work/$label.diff"; then
        pass "install ($label): ${#expected[@]} files in the right places"
    else
        sed 's/^/    | /' "$work/$label.diff"
        fail "install ($label): installed files differ from the expected list"
    fi

    [ "$(readlink "$dest$libdir/libsqdisc.so")" = "libsqdisc.so.$major" ] \
        && [ "$(readlink "$dest$libdir/libsqdisc.so.$major")" = "libsqdisc.so.$version" ] \
        && pass "install ($label): libsqdisc.so -> .so.$major -> .so.$version" \
        || fail "install ($label): the library links are wrong"

    local pc=$dest$pcdir/sqdisc.pc
    if grep -q -F "$dest" "$pc"; then
        fail "install ($label): DESTDIR leaked into sqdisc.pc"
    else
        pass "install ($label): sqdisc.pc does not mention DESTDIR"
    fi
    local got_libdir got_incdir
    got_libdir=$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=libdir sqdisc)
    got_incdir=$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=includedir sqdisc)
    if [ "$got_libdir" = "$libdir" ] && [ "$got_incdir" = "$includedir" ] \
        && [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --modversion sqdisc)" = "$version" ]; then
        pass "install ($label): sqdisc.pc names libdir $libdir, includedir $includedir, version $version"
    else
        cat "$pc" | sed 's/^/    | /'
        fail "install ($label): sqdisc.pc gives libdir '$got_libdir', includedir '$got_incdir'"
    fi
    [ "$(readlink "$dest$libdir/libsqdisc_sim.so")" = "libsqdisc_sim.so.$sim_major" ] \
        && [ "$(readlink "$dest$libdir/libsqdisc_sim.so.$sim_major")" = "libsqdisc_sim.so.$sim_version" ] \
        && pass "install ($label): libsqdisc_sim.so -> .so.$sim_major -> .so.$sim_version" \
        || fail "install ($label): libsqdisc_sim.so links are wrong"
    if [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=libdir sqdisc_sim)" = "$libdir" ] \
        && [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=includedir sqdisc_sim)" = "$includedir" ] \
        && [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --modversion sqdisc_sim)" = "$sim_version" ] \
        && PKG_CONFIG_PATH=$dest$pcdir pkg-config --print-requires sqdisc_sim | grep -qx 'sqdisc' \
        && ! grep -q "$dest" "$dest$pcdir/sqdisc_sim.pc"; then
        pass "install ($label): sqdisc_sim.pc names libdir $libdir, includedir $includedir, version $sim_version, requires sqdisc, no DESTDIR"
    else
        sed 's/^/    | /' "$dest$pcdir/sqdisc_sim.pc"
        fail "install ($label): sqdisc_sim.pc is wrong"
    fi

    [ "$(readlink "$dest$libdir/libsqdisc_spdk.so")" = "libsqdisc_spdk.so.$spdk_major" ] \
        && [ "$(readlink "$dest$libdir/libsqdisc_spdk.so.$spdk_major")" = "libsqdisc_spdk.so.$spdk_version" ] \
        && pass "install ($label): libsqdisc_spdk.so -> .so.$spdk_major -> .so.$spdk_version" \
        || fail "install ($label): libsqdisc_spdk.so links are wrong"
    if [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=libdir sqdisc_spdk)" = "$libdir" ] \
        && [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --modversion sqdisc_spdk)" = "$spdk_version" ] \
        && ! grep -q "$dest" "$dest$pcdir/sqdisc_spdk.pc"; then
        pass "install ($label): sqdisc_spdk.pc names libdir $libdir, version $spdk_version, no DESTDIR"
    else
        sed 's/^/    | /' "$dest$pcdir/sqdisc_spdk.pc"
        fail "install ($label): sqdisc_spdk.pc is wrong"
    fi

    [ "$(readlink "$dest$libdir/libsqdisc_check.so")" = "libsqdisc_check.so.$check_major" ] \
        && [ "$(readlink "$dest$libdir/libsqdisc_check.so.$check_major")" = "libsqdisc_check.so.$check_version" ] \
        && pass "install ($label): libsqdisc_check.so -> .so.$check_major -> .so.$check_version" \
        || fail "install ($label): libsqdisc_check.so links are wrong"
    if [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=libdir sqdisc_check)" = "$libdir" ] \
        && [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --variable=includedir sqdisc_check)" = "$includedir" ] \
        && [ "$(PKG_CONFIG_PATH=$dest$pcdir pkg-config --modversion sqdisc_check)" = "$check_version" ] \
        && ! grep -q "$dest" "$dest$pcdir/sqdisc_check.pc"; then
        pass "install ($label): sqdisc_check.pc names libdir $libdir, includedir $includedir, version $check_version, no DESTDIR"
    else
        sed 's/^/    | /' "$dest$pcdir/sqdisc_check.pc"
        fail "install ($label): sqdisc_check.pc is wrong"
    fi

    # `sqdisc-sim run` finds its preload library in ../lib: in the default layout that is where it is installed.
    if [ "$libdir" = "$prefix/lib" ]; then
        if env -u LD_PRELOAD SQDISC_SIM_PRELOAD= SQDISC_SIM_SOCKET=$work/$label.socket "$dest$prefix/bin/sqdisc-sim" run -- sh -c 'echo "$LD_PRELOAD"' \
            > "$work/$label.run" 2>&1 && grep -qx "$(cd "$dest$libdir" && pwd -P)/libsqdisc_sim_preload.so" "$work/$label.run"; then
            pass "install ($label): sqdisc-sim run preloads $libdir/libsqdisc_sim_preload.so"
        else
            sed 's/^/    | /' "$work/$label.run"
            fail "install ($label): sqdisc-sim run does not find the installed preload library"
        fi
        SQDISC_SIM_SOCKET=$work/$label.socket "$dest$prefix/bin/sqdisc-sim" stop > /dev/null 2>&1 || true
    fi

    if ! $make_cmd --no-print-directory -s uninstall DESTDIR="$dest" "$@" > "$work/$label.log" 2>&1; then
        sed 's/^/    | /' "$work/$label.log" | tail -n 30
        fail "uninstall ($label): make uninstall failed"; return
    fi
    local left
    left=$(cd "$dest" && find . ! -type d | sed 's|^\.||')
    if [ -z "$left" ]; then
        pass "uninstall ($label): nothing left"
    else
        printf '    | %s\n' $left
        fail "uninstall ($label): files left behind"
    fi
}

round_trip default /usr/local /usr/local/lib /usr/local/include /usr/local/lib/pkgconfig
round_trip custom /opt/sqd /opt/sqd/lib64 /srv/headers /usr/share/pkgconfig \
    PREFIX=/opt/sqd LIBDIR=/opt/sqd/lib64 INCLUDEDIR=/srv/headers PKGCONFIGDIR=/usr/share/pkgconfig

echo "install round trip: $passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
