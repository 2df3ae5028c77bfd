#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs one command in a small QEMU guest with N NUMA nodes, so that multi-node layouts (one worker
# per node, mbind placement, pinning) are tested on a host with one node.
#
#   tests/numa/guest.sh [--nodes N] [--cpus-per-node C] [--mem-per-node MIB] [--timeout S]
#                       [--env NAME=VALUE]... [--share DIR]... -- COMMAND [ARG]...
#
# The guest boots a Debian kernel with a busybox initramfs, mounts this machine's root filesystem
# read-only over virtio-9p and runs COMMAND chrooted into it, in the current folder, as root, with
# an environment of PATH, HOME=/tmp and the --env pairs only, and fresh empty tmpfs on /tmp,
# /dev/shm and /run, where --share DIR shows a host folder read-only at its own path (a build tree
# or clone under /tmp); nothing the command writes outlives the guest. No network. Software
# emulation (TCG): slow, AVX2 at most; keep the command small.
#
# Prints the command's output (stdout and stderr together) as it comes and exits with its status;
# 124 when it outlives --timeout (default 600 s); 125 when the guest cannot be set up or did not
# report a status, with the reason on stderr.
#
# First use installs qemu-system-x86, busybox-static, cpio and kmod from Debian (as root, or
# through sudo) and extracts the current Debian kernel package into the cache, with the 9p and
# virtio modules it needs: SHARDLM_GUEST_CACHE, default /var/cache/shardlm/guest for root and
# ~/.cache/shardlm/guest otherwise. Later runs need neither the network nor root.
set -euo pipefail

usage() { sed -n '3,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "guest: $*" >&2; exit 125; }

nodes=2 cpn=1 mem=1024 timeout_s=600
envs=() shares=()
while [ $# -gt 0 ]; do
  case $1 in
  --nodes | --cpus-per-node | --mem-per-node | --timeout | --env | --share)
    [ $# -ge 2 ] || die "$1 needs a value (see --help)";;
  esac
  case $1 in
  --nodes) nodes=$2; shift 2;;
  --cpus-per-node) cpn=$2; shift 2;;
  --mem-per-node) mem=$2; shift 2;;
  --timeout) timeout_s=$2; shift 2;;
  --env) [[ $2 == [A-Za-z_]*=* ]] || die "--env wants NAME=VALUE, not '$2'"; envs+=("$2"); shift 2;;
  --share)
    d=$(realpath -e "$2") && [ -d "$d" ] || die "--share $2: not a folder"
    [[ $d != *,* ]] || die "--share $d: QEMU cannot take a path with a comma"
    shares+=("$d"); shift 2;;
  -h | --help) usage; exit 0;;
  --) shift; break;;
  *) die "unknown option '$1' (see --help)";;
  esac
done
[ $# -gt 0 ] || die "no command given (guest.sh [options] -- COMMAND)"
for v in "$nodes" "$cpn" "$mem" "$timeout_s"; do
  [[ $v =~ ^[1-9][0-9]{0,5}$ ]] || die "'$v' is not a positive count (see --help)"
done
[ "$nodes" -le 64 ] || die "--nodes $nodes: at most 64"

# the command runs in the current folder: refuse one that the guest's fresh tmpfs would hide
case $PWD/ in
/tmp/* | /dev/shm/* | /run/*)
  seen=false
  for d in "${shares[@]}"; do [[ $PWD/ == "$d"/* ]] && seen=true; done
  $seen || die "the guest cannot see $PWD (a fresh tmpfs there): --share it or a folder above";;
esac

if [ "$(id -u)" -eq 0 ]; then
  cache=${SHARDLM_GUEST_CACHE:-/var/cache/shardlm/guest}
  sudo=()
else
  cache=${SHARDLM_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardlm/guest}
  sudo=(sudo -n)
fi

# --- host tools, installed once --------------------------------------------------------------
install_tools() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  # the initramfs has no libraries: busybox must be the static build
  [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  command -v depmod >/dev/null && command -v modprobe >/dev/null || need+=(kmod)
  [ ${#need[@]} -eq 0 ] && return 0
  echo "guest: installing ${need[*]} from Debian (first use)" >&2
  if ! { "${sudo[@]}" apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
           --no-install-recommends "${need[@]}"; } >"$cache/apt.log" 2>&1; then
    die "could not install ${need[*]}: $(tail -1 "$cache/apt.log") (full log: $cache/apt.log;" \
        "as root: apt-get install ${need[*]})"
  fi
}

# --- the kernel, extracted once into the cache -----------------------------------------------
# $cache/kernel/: vmlinuz, and the modules that reach the host's root over virtio-9p with the
# order to load them in (modprobe resolves it from the package's own modules.dep).
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1
}
extract_kernel() {
  local tmp pkg kver m f
  pkg=$(kernel_package)
  if [ -z "$pkg" ]; then
    "${sudo[@]}" apt-get update -qq >>"$cache/apt.log" 2>&1 || true
    pkg=$(kernel_package)
  fi
  [ -n "$pkg" ] || die "apt-cache knows no linux-image-amd64 (run apt-get update)"
  echo "guest: extracting $pkg into $cache (first use)" >&2
  tmp=$(mktemp -d "$cache/extract.XXXXXX")
  (cd "$tmp" && apt-get download "$pkg") >>"$cache/apt.log" 2>&1 ||
    { rm -rf "$tmp"; die "apt-get download $pkg failed (see $cache/apt.log)"; }
  dpkg-deb -x "$tmp"/*.deb "$tmp/pkg"
  kver=${pkg#linux-image-}
  [ -d "$tmp/pkg/lib/modules/$kver" ] || { rm -rf "$tmp"; die "$pkg holds no lib/modules/$kver"; }
  depmod -b "$tmp/pkg" "$kver"
  mkdir -p "$tmp/kernel/mods"
  for m in virtio_pci 9pnet_virtio 9p; do
    modprobe -d "$tmp/pkg" -S "$kver" --show-depends "$m"
  done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r f; do
    m=$(basename "$f")
    case $m in
    *.ko) cp "$f" "$tmp/kernel/mods/$m";;
    *.ko.xz) m=${m%.xz}; xz -dc "$f" >"$tmp/kernel/mods/$m";;
    *.ko.zst) m=${m%.zst}; zstd -qdc "$f" >"$tmp/kernel/mods/$m";;
    *) echo "guest: unexpected module file $f" >&2; exit 1;;
    esac
    echo "$m" >>"$tmp/kernel/mods/order"
  done || { rm -rf "$tmp"; die "could not copy the modules of $pkg"; }
  grep -qx 9p.ko "$tmp/kernel/mods/order" 2>/dev/null ||
    { rm -rf "$tmp"; die "$pkg: modprobe found no 9p module"; }
  cp "$tmp/pkg/boot/vmlinuz-$kver" "$tmp/kernel/vmlinuz"
  echo "$kver" >"$tmp/kernel/version"
  rm -rf "$cache/kernel"
  mv "$tmp/kernel" "$cache/kernel"
  rm -rf "$tmp"
}

# PID 1 of the guest (busybox sh). ttyS0 carries the command's output, ttyS1 the kernel's console
# (kept in a file for a failed boot), ttyS2 the command's exit status.
write_init() {
  cat <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# "exit N" for the command's status, "setup failed" (the reason is on the console)
report() { echo "$1" >/dev/ttyS2; sync; poweroff -f; }
fail() { echo "guest init: $1" >/dev/ttyS1; report "setup failed"; }
for m in $(cat /mods/order); do
  insmod "/mods/$m" || fail "insmod $m failed"
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /host ||
  fail "cannot mount the host's root over 9p"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
for d in /host/tmp /host/dev/shm /host/run; do
  mkdir -p "$d" 2>/dev/null
  mount -t tmpfs -o mode=1777 tmpfs "$d"
done
i=0
while read -r d; do
  mkdir -p "/host$d" 2>/dev/null
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 "share$i" "/host$d" ||
    fail "cannot mount the shared folder $d"
  i=$((i + 1))
done </shares
stty -F /dev/ttyS0 -onlcr 2>/dev/null
chroot /host /usr/bin/env -i /bin/bash -c "$(cat /run.cmd)" </dev/null >/dev/ttyS0 2>&1
report "exit $?"
INIT
}

mkdir -p "$cache" || die "cannot create the cache folder $cache"
exec 9>"$cache/lock"
flock 9 # one setup at a time; a second run waits here for the first one's
install_tools
[ -s "$cache/kernel/version" ] || extract_kernel
flock -u 9

# --- this run ---------------------------------------------------------------------------------
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# the initramfs: busybox, the modules, /init and the command (built anew: a few milliseconds)
root=$work/initramfs
mkdir -p "$root"/{bin,proc,sys,dev,host}
cp /bin/busybox "$root/bin/busybox"
cp -r "$cache/kernel/mods" "$root/mods"
write_init >"$root/init"
chmod 0755 "$root/init"
# one line for the guest's bash: the environment, the folder, the command, each word quoted
{
  printf 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp'
  [ ${#envs[@]} -eq 0 ] || printf ' %q' "${envs[@]}"
  printf '; cd %q && exec' "$PWD"
  printf ' %q' "$@"
  echo
} >"$root/run.cmd"
[ ${#shares[@]} -eq 0 ] && : >"$root/shares" || printf '%s\n' "${shares[@]}" >"$root/shares"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd"

# software emulation: KVM inside this project's (nested) VMs failed at the first MSR with -cpu max
# and hung at boot with -cpu host, so it is not offered
args=(-accel tcg,thread=multi -cpu max -machine q35 -m $((nodes * mem))
      -smp $((nodes * cpn)),sockets="$nodes",cores="$cpn",threads=1)
for ((n = 0; n < nodes; n++)); do
  args+=(-object memory-backend-ram,id=mem$n,size="${mem}M"
         -numa node,nodeid=$n,cpus=$((n * cpn))-$((n * cpn + cpn - 1)),memdev=mem$n)
done
args+=(-nodefaults -no-user-config -display none -monitor none -no-reboot
       -kernel "$cache/kernel/vmlinuz" -initrd "$work/initrd"
       -append "console=ttyS1 panic=-1 quiet loglevel=4"
       -chardev stdio,id=out,signal=off -serial chardev:out
       -serial file:"$work/console" -serial file:"$work/status"
       -fsdev local,id=root,path=/,security_model=none,readonly=on,multidevs=remap
       -device virtio-9p-pci,fsdev=root,mount_tag=hostroot)
for i in "${!shares[@]}"; do
  args+=(-fsdev local,id=share$i,path="${shares[$i]}",security_model=none,readonly=on
         -device virtio-9p-pci,fsdev=share$i,mount_tag=share$i)
done
echo "guest: $nodes NUMA nodes x $cpn CPUs, $mem MiB each," \
  "kernel $(cat "$cache/kernel/version")" >&2

set +e
timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 "${args[@]}" </dev/null 2>"$work/qemu.err" |
  tr -d '\r'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "guest: the command outlived --timeout $timeout_s s" >&2
  exit 124
fi
status=$(tr -d '\r' <"$work/status" 2>/dev/null || true)
case $status in
exit\ [0-9]*) exit "${status#exit }";;
esac
echo "guest: ${status:-no exit status from the guest} (qemu exited $rc);" \
  "qemu and the console said:" >&2
tail -5 "$work/qemu.err" >&2
tail -20 "$work/console" >&2
exit 125
