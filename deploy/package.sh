#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the Debian package: a release build installed under /usr, packed by CPack
# (cmake/package.cmake: Depends from the linked libraries through dpkg-shlibdeps), then checked
# with lintian. Prints the package's path last.
#   deploy/package.sh [BUILD_DIR]     (default build-deb; needs dpkg-dev, help2man, lintian)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-deb}
for tool in dpkg-shlibdeps help2man lintian; do
    command -v "$tool" >/dev/null || {
        echo "package: $tool not found (apt-get install dpkg-dev help2man lintian)" >&2
        exit 1
    }
done
# a folder of its own: another build given by mistake (the dev build, `build`) would be
# reconfigured as a Release build for /usr
if [ -f "$dir/CMakeCache.txt" ] && ! grep -qx 'CMAKE_INSTALL_PREFIX:PATH=/usr' "$dir/CMakeCache.txt"; then
    echo "package: $dir is another build (its install prefix is not /usr): give a folder of its own (default build-deb)" >&2
    exit 2
fi
# Debian's compiler flags with every hardening feature (PIE, full RELRO with BIND_NOW,
# _FORTIFY_SOURCE, the stack protector, CET): CMake puts them before the build type's -O3
export DEB_BUILD_MAINT_OPTIONS=hardening=+all
eval "$(dpkg-buildflags --export=sh)"
export CFLAGS="$CFLAGS $CPPFLAGS" # CMake reads no CPPFLAGS
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr >/dev/null
cmake --build "$dir" -j"$(nproc)" --target shardlm shardlm-worker shardlm_man \
    shardlm_bundled_model shardlm_changelog >/dev/null
rm -f "$dir"/shardlm_*.deb
(cd "$dir" && cpack -G DEB >/dev/null)
deb=$(ls "$dir"/shardlm_*.deb)
# lintian: errors fail; the overrides the package ships (deploy/debian/lintian-overrides) say why
lintian --tag-display-limit 0 "$deb" >&2 || {
    echo "package: lintian found errors in $deb" >&2
    exit 1
}
echo "$deb"
