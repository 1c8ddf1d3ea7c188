#!/usr/bin/env bash
# The three ways docs/spdk.md gives to put libsqdisc_spdk in an SPDK build, tried on a program linked the way
# SPDK's applications link the provider, against a stand-in for SPDK's own libspdk_rdma_provider
# (c-tests/spdk-dropin/): without sqdisc the program must reach SPDK's provider; replaced (a file named as
# SPDK's soname, first on the library path), preloaded (LD_PRELOAD) and, in a static build, its archive put in
# the place of SPDK's inside --whole-archive, it must reach sqdisc's.
# usage: check-spdk-dropin.sh STAGE_DIR LIBDIR_IN_STAGE
set -euo pipefail
stage=$1 libdir=$2
root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/c-tests/spdk-dropin
out=$root/build/spdk-dropin
CC=${CC:-cc}
stage_lib=$stage$libdir
spdk_soname=libspdk_rdma_provider.so.9
pc() {
    PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_PATH=$stage_lib/pkgconfig \
        PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 PKG_CONFIG_ALLOW_SYSTEM_LIBS=1 pkg-config "$@"
}
read -r -a cflags <<< "$(pc --cflags sqdisc_spdk)"
read -r -a static_deps <<< "$(pc --static --libs-only-l sqdisc_spdk | sed 's/-lsqdisc_spdk//')"
failed=0
expect() { # name expected-output command...
    local name=$1 want=$2; shift 2
    local got
    got=$("$@" 2>&1) || true
    if [ "$got" = "$want" ]; then echo "PASS spdk-dropin $name: the program reached $want's provider"
    else echo "FAIL spdk-dropin $name: expected $want, got: $got"; failed=1; fi
}

rm -rf "$out" && mkdir -p "$out"/{spdk,replaced,spdk-static,replaced-static}
# SPDK's provider library and a program linked to it, as a shared-library SPDK build has them.
"$CC" -std=c11 -Wall -Werror -fPIC -shared "${cflags[@]}" "$src/fake_provider.c" \
    -Wl,-soname,$spdk_soname -o "$out/spdk/$spdk_soname"
ln -sfn $spdk_soname "$out/spdk/libspdk_rdma_provider.so"
"$CC" -std=c11 -Wall -Werror "${cflags[@]}" "$src/app.c" -rdynamic -L"$out/spdk" -lspdk_rdma_provider \
    -o "$out/app-shared"
expect "shared, as built" spdk env LD_LIBRARY_PATH="$out/spdk" "$out/app-shared"
expect "shared, preloaded" sqdisc env LD_LIBRARY_PATH="$out/spdk" LD_PRELOAD="$stage_lib/libsqdisc_spdk.so.0" \
    "$out/app-shared"
ln -sfn "$stage_lib/libsqdisc_spdk.so.0" "$out/replaced/$spdk_soname"
expect "shared, replaced" sqdisc env LD_LIBRARY_PATH="$out/replaced:$out/spdk" "$out/app-shared"

# A static SPDK build: every SPDK archive inside --whole-archive.
"$CC" -std=c11 -Wall -Werror -c "${cflags[@]}" "$src/fake_provider.c" -o "$out/fake_provider.o"
ar rcs "$out/spdk-static/libspdk_rdma_provider.a" "$out/fake_provider.o"
cp "$stage_lib/libsqdisc_spdk.a" "$out/replaced-static/libspdk_rdma_provider.a"
for variant in spdk-static replaced-static; do
    "$CC" -std=c11 -Wall -Werror "${cflags[@]}" "$src/app.c" -L"$out/$variant" \
        -Wl,--whole-archive -Wl,--no-as-needed -lspdk_rdma_provider -Wl,--no-whole-archive \
        "${static_deps[@]}" -o "$out/app-$variant"
done
expect "static, as built" spdk env -u LD_LIBRARY_PATH "$out/app-spdk-static"
expect "static, archive replaced" sqdisc env -u LD_LIBRARY_PATH "$out/app-replaced-static"
[ "$failed" -eq 0 ]
