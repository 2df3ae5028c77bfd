#!/usr/bin/env bash
# shardlm quick start: install what is missing (Debian 12), build, convert the bundled
# stories260K model to 4-bit and generate text with it.
#   deploy/bootstrap.sh [--no-run]      (BUILD_DIR=build by default)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

PACKAGES=(build-essential cmake pkg-config procps libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
          libnuma-dev liburing-dev libcmocka-dev libjansson-dev libpcre2-dev libmicrohttpd-dev
          python3-jinja2 curl iproute2 chromium)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm run the server's client tests (tests/openai, tests/web): Debian's, unless the
# machine has its own
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# the npm packages the server's client tests use, as each package-lock.json pins them
for d in tests/openai tests/web; do
  lock="$d/package-lock.json"
  if [ -f "$lock" ] && [ "$lock" -nt "$d/node_modules/.package-lock.json" ]; then
    echo "bootstrap: npm ci --prefix $d" >&2
    npm ci --prefix "$d" --no-audit --no-fund --loglevel=error >/dev/null
  fi
done

[ "${1:-}" = "--no-run" ] && exit 0
model="$BUILD_DIR/stories260K-w4a8.shlm"
"$BUILD_DIR/shardlm" convert models/stories260K/stories260K.bin \
  --tokenizer models/stories260K/tok512.bin --scheme w4a8 -o "$model"
"$BUILD_DIR/shardlm" generate -m "$model" -p "Once upon a time" -n 120 --temp 0
