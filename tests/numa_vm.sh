#!/usr/bin/env bash
# Runs test_numa in a QEMU guest with NODES NUMA nodes of one CPU each (SHARED_DIR/tools/numa-vm).
#
#   tests/numa_vm.sh NODES BUILD_DIR SHARED_DIR
#
# The guest sees this machine's root filesystem read-only, with empty tmpfs on /tmp, /dev/shm and
# /run, and no environment: so the model is converted here, into BUILD_DIR/numa (BUILD_DIR must
# not be under /tmp), and test_numa gets its paths as arguments.
# Exits with test_numa's status; 77 (skip) when the guest has fewer than 2 nodes or QEMU cannot be
# installed.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 NODES BUILD_DIR SHARED_DIR" >&2; exit 2; }
nodes=$1
build=$(realpath "$2")
shared=$(realpath "$3")
src=$(realpath "$(dirname "$0")/..")
vm=$shared/tools/numa-vm

[ -x "$vm" ] || { echo "SKIP: $vm not found; it is needed to emulate $nodes NUMA nodes"; exit 77; }
case "$build/" in
/tmp/* | /dev/shm/* | /run/*)
  echo "numa_vm.sh: $build is hidden from the guest (a fresh tmpfs there); build elsewhere" >&2
  exit 2;;
esac
for f in "$build/shardlm" "$build/shardlm-worker" "$build/tests/test_numa"; do
  [ -x "$f" ] || { echo "numa_vm.sh: $f not built" >&2; exit 2; }
done

# converted anew each time (cheap), under a private name and renamed: the 2- and 4-node tests may
# run at once and share the file
mkdir -p "$build/numa"
model=$build/numa/f32.shlm
"$build/shardlm" convert "$src/models/stories260K/stories260K.bin" \
  --tokenizer "$src/models/stories260K/tok512.bin" --scheme f32 -o "$model.$$.tmp" -q
mv -f "$model.$$.tmp" "$model"

# numa-vm exits 2 with a line "numa-vm: ..." on its stderr when it cannot install QEMU or fetch
# its kernel (the guest's own output comes on its stdout).
err=$(mktemp)
trap 'rm -f "$err"' EXIT
cd "$build" # numa-vm runs the command in the current folder, which the guest must see
set +e
"$vm" --nodes "$nodes" --cpus-per-node 1 --timeout 900 -- \
  "$build/tests/test_numa" "$build/shardlm" "$model" "$shared" 2>"$err"
rc=$?
set -e
cat "$err" >&2
if [ $rc -eq 2 ] && grep -q '^numa-vm: ' "$err"; then
  echo "SKIP: $(grep '^numa-vm: ' "$err" | head -1)"
  exit 77
fi
exit $rc
