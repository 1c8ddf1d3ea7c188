#!/usr/bin/env bash
# The facts about SPDK's releases that the drop-in checks need, committed under spdk/releases/<release>/:
#   VERSION      the release, its commit and date, the soname of its libspdk_rdma_provider
#   exports.txt  every symbol the release's libraries export, as "<map name> <symbol>" (sorted), from SPDK's
#                lib/**/*.map version scripts at that commit
# usage:
#   spdk-releases.sh import [DIR]              copy DIR/<release>/{VERSION,exports.txt} (default ../shared/spdk
#                                              beside the repository) into spdk/releases/, normalised
#   spdk-releases.sh check [DIR]               compare spdk/releases/ with DIR (skipped when DIR does not exist)
#   spdk-releases.sh derive GIT_DIR REF NAME   derive spdk/releases/NAME/ from an SPDK git repository at REF
#                                              (a tag such as v26.05, or a commit for master)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
releases=$root/spdk/releases
default_src=$root/../shared/spdk

normalise() { LC_ALL=C sort -u "$1"; }

cmd=${1:-}
case $cmd in
import)
    src=${2:-$default_src}
    [ -d "$src" ] || { echo "spdk-releases: no $src" >&2; exit 1; }
    for d in "$src"/*/; do
        r=$(basename "$d")
        [ -f "$d/VERSION" ] && [ -f "$d/exports.txt" ] || continue
        mkdir -p "$releases/$r"
        cp "$d/VERSION" "$releases/$r/VERSION"
        normalise "$d/exports.txt" > "$releases/$r/exports.txt"
        echo "spdk-releases: $r: $(wc -l < "$releases/$r/exports.txt") exports, $(sed -n 's/^rdma_provider_soname //p' "$releases/$r/VERSION")"
    done
    ;;
check)
    src=${2:-$default_src}
    if [ ! -d "$src" ]; then
        echo "spdk-releases: $src not present; the committed spdk/releases/ is used as it is"
        exit 0
    fi
    failed=0
    for d in "$src"/*/; do
        r=$(basename "$d")
        [ -f "$d/exports.txt" ] || continue
        if [ ! -d "$releases/$r" ]; then
            echo "FAIL spdk-releases: $r is in $src but not in spdk/releases (scripts/spdk-releases.sh import)"; failed=1; continue
        fi
        cmp -s "$d/VERSION" "$releases/$r/VERSION" \
            || { echo "FAIL spdk-releases: $r: VERSION differs from $d/VERSION"; failed=1; }
        if ! diff -q <(normalise "$d/exports.txt") "$releases/$r/exports.txt" >/dev/null; then
            echo "FAIL spdk-releases: $r: exports.txt differs from $d/exports.txt:"
            diff <(normalise "$d/exports.txt") "$releases/$r/exports.txt" | head -20
            failed=1
        fi
    done
    [ "$failed" -eq 0 ] && echo "spdk-releases: spdk/releases/ matches $src"
    exit "$failed"
    ;;
derive)
    git_dir=$2 ref=$3 name=$4
    g() { git --git-dir="$git_dir" "$@"; }
    commit=$(g rev-parse "$ref^{commit}")
    out=$releases/$name
    mkdir -p "$out"
    # A map is "{ global: sym; sym; ... local: *; };" with # comments: the symbols between global: and local:.
    g ls-tree -r --name-only "$commit" lib | grep -E '^lib/.+\.map$' | while read -r map; do
        g show "$commit:$map" | sed 's/#.*//' | tr -s ' \t;' '\n' \
            | awk -v m="$(basename "$map" .map)" '/^global:$/ { on = 1; next } /^local:$/ { on = 0 } on && /^[A-Za-z_][A-Za-z0-9_]*$/ { print m, $0 }'
    done | LC_ALL=C sort -u > "$out/exports.txt"
    so_ver=$(g show "$commit:lib/rdma_provider/Makefile" | sed -n 's/^SO_VER := *//p')
    {
        echo "release $name"
        echo "commit $commit"
        echo "commit_date $(g show -s --format=%cs "$commit")"
        echo "rdma_provider_soname libspdk_rdma_provider.so.$so_ver"
    } > "$out/VERSION"
    echo "spdk-releases: $name ($commit): $(wc -l < "$out/exports.txt") exports, soname libspdk_rdma_provider.so.$so_ver"
    ;;
*)
    sed -n '2,/^set /p' "$0" | sed '$d' >&2
    exit 2
    ;;
esac
