#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shardlm quick start: install what is missing (Debian 12), build, convert the bundled
# stories260K model to 4-bit and generate text with it.
#   deploy/bootstrap.sh [--no-run]      (BUILD_DIR=build by default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo

PACKAGES=(build-essential cmake pkg-config procps libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
          libnuma-dev liburing-dev libcmocka-dev libjansson-dev libpcre2-dev libmicrohttpd-dev
          libicu-dev
          python3-jinja2 python3-jsonschema curl iproute2 chromium
          help2man dpkg-dev lintian systemd strace haproxy)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm run the server's client tests (tests/openai, tests/web) and the real tokenizers'
# test (tests/tokenizers): Debian's, unless the machine has its own
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# the npm packages the server's client tests use, as each package-lock.json pins them
for d in tests/openai tests/web tests/tokenizers; do
  lock="$d/package-lock.json"
  if [ -f "$lock" ] && [ "$lock" -nt "$d/node_modules/.package-lock.json" ]; then
    echo "bootstrap: npm ci --prefix $d" >&2
    npm ci --prefix "$d" --no-audit --no-fund --loglevel=error >/dev/null
  fi
done

# promtool (tests/deploy/test_metrics.sh) from Debian's prometheus package, unpacked into the
# build folder: installing the package would start a Prometheus server on this machine
promtool="$BUILD_DIR/tools/promtool"
if [ ! -x "$promtool" ]; then
    echo "bootstrap: unpacking promtool from Debian's prometheus into $BUILD_DIR/tools" >&2
    tmp=$(mktemp -d)
    # (apt's package lists first, where this machine has none yet)
    if (cd "$tmp" && { apt-get download -qq prometheus 2>/dev/null ||
        { $SUDO apt-get update -qq && apt-get download -qq prometheus 2>/dev/null; }; } &&
        dpkg-deb -x prometheus_*.deb x); then
        mkdir -p "$BUILD_DIR/tools"
        cp "$tmp/x/usr/bin/promtool" "$promtool"
    else
        echo "bootstrap: could not download Debian's prometheus (no network?): test_metrics will fail" >&2
    fi
    rm -rf "$tmp"
fi

[ "${1:-}" = "--no-run" ] && exit 0
model="$BUILD_DIR/stories260K-w4a8.shlm"
"$BUILD_DIR/shardlm" convert models/stories260K/stories260K.bin \
  --tokenizer models/stories260K/tok512.bin --scheme w4a8 -o "$model"
"$BUILD_DIR/shardlm" generate -m "$model" -p "Once upon a time" -n 120 --temp 0
