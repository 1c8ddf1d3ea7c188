#!/usr/bin/env bash
# Makes sure what the build and the checks use is installed.
#   install-deps.sh build   the Debian packages that building the libraries and the examples needs
#                           (`make`, `make install`, `make demo`): nothing else
#   install-deps.sh [check] those, the packages of the C checks, and the nightly Rust tools that the fuzzer,
#                           Miri and ThreadSanitizer runs use (`make check`)
# As root, missing Debian packages are installed with apt-get; otherwise the script fails and names them.
set -euo pipefail

profile=${1:-check}
case $profile in
build | check) ;;
*)
    echo "usage: install-deps.sh [build|check]" >&2
    exit 2
    ;;
esac

packages=(
    libibverbs-dev librdmacm-dev # verbs headers and libraries (rdma-sys, the C headers, the SPDK provider)
    libclang-dev clang           # rdma-sys generates its bindings with libclang
    pkg-config                   # rdma-sys finds the verbs libraries; examples and C tests use sqdisc.pc
    gcc make binutils            # the C compiler, ld/objcopy/nm/ar for the static libraries
)
if [ "$profile" = check ]; then
    packages+=(
        valgrind # C tests under valgrind, callgrind for the benchmark guard
        g++      # the C++ header check
        # unmodified verbs programs that make sim-matrix runs on the device daemon (scripts/sim-matrix.sh)
        ibverbs-utils rdmacm-utils perftest qperf
    )
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-deps: not a Debian system; make sure these (or their equivalents) are installed:" >&2
    echo "  ${packages[*]}" >&2
    exit 0
fi

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = installed ] || missing+=("$p")
done


if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} system packages present"
else
    if [ "$(id -u)" -ne 0 ]; then
        echo "install-deps: missing Debian packages: ${missing[*]}" >&2
        echo "install-deps: run as root, or: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi

    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

[ "$profile" = build ] && exit 0

# The C API fuzzer (scripts/fuzz.sh): cargo-fuzz, which builds with the nightly toolchain (-Zsanitizer=address).
if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if command -v cargo >/dev/null 2>&1; then
    if ! cargo +nightly --version >/dev/null 2>&1; then
        echo "install-deps: installing the nightly Rust toolchain (for cargo-fuzz)"
        rustup toolchain install nightly --profile minimal
    fi
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        echo "install-deps: installing cargo-fuzz"
        cargo install --locked cargo-fuzz --version 0.13.2
    fi
    echo "install-deps: fuzzing tools present ($(cargo +nightly fuzz --version))"
fi

# `make miri` (scripts/miri.sh) needs a nightly toolchain with Miri and the standard library's sources.
# rustup installs them for the user who runs the build; without rustup the script says what is needed.
rust_miri() {
    local tc=${MIRI_TOOLCHAIN:-nightly}
    if cargo "+$tc" miri --version >/dev/null 2>&1; then
        return 0
    fi
    if ! command -v rustup >/dev/null 2>&1; then
        echo "install-deps: no rustup: install a $tc toolchain with the miri and rust-src components for make miri" >&2
        return 1
    fi
    echo "install-deps: rustup toolchain install $tc --profile minimal --component miri rust-src"
    rustup toolchain install "$tc" --profile minimal --component miri --component rust-src
    cargo "+$tc" miri setup
}
if command -v cargo >/dev/null 2>&1; then
    rust_miri
fi
