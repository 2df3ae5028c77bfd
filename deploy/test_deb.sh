#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian package on this machine, as CI checks it: builds it (deploy/package.sh, lintian
# included), installs it with apt-get, runs the installed shardlm (version, man page, a conversion
# and a generation from /usr/share/shardlm, as root and as the service user, equal to the build
# tree's text), then purges it and checks that none of its files, its settings folder or its
# user's segments is left. Needs root (or sudo); refuses to run where shardlm is already installed.
#   deploy/test_deb.sh [BUILD_DIR]     (default build-deb)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
fail() { echo "test_deb: FAIL: $*" >&2; exit 1; }
if dpkg-query -W -f='${Status}' shardlm 2>/dev/null | grep -q "ok installed"; then
    echo "test_deb: shardlm is installed on this machine: not touching it (apt-get purge shardlm first)" >&2
    exit 1
fi

deb=$(deploy/package.sh "${1:-build-deb}" | tail -1)
dir=$(dirname "$deb")
work=$(mktemp -d)
installed=0
mounted=()
cleanup() {
    [ "$installed" = 1 ] && $SUDO apt-get purge -y -qq shardlm >/dev/null 2>&1 || true
    for m in "${mounted[@]}"; do $SUDO umount -l "$m" || true; done
    $SUDO rm -rf --one-file-system "$work"
}
trap cleanup EXIT
chmod 755 "$work" # the service user reads a converted model from it below

# the text every installed copy must generate: the build tree's
SHARDLM_RUNTIME_DIR=$work/rt
mkdir -m 700 "$SHARDLM_RUNTIME_DIR"
export SHARDLM_RUNTIME_DIR
prompt="Once upon a time"
"$dir/shardlm" generate -m "$dir/share/stories260K-w4a8.shlm" -p "$prompt" -n 60 --temp 0 \
    --no-persist > "$work/want.txt" 2>/dev/null

# 1. a clean Debian 12 (debootstrap's minbase, in a folder of ours): apt-get resolves the Depends
#    from Debian's archive, the fallback path of postinst makes the user (no systemd there)
root=$work/bookworm
echo "test_deb: debootstrap a clean Debian 12 into $root" >&2
command -v debootstrap >/dev/null || fail "debootstrap is not installed (apt-get install debootstrap)"
mirror=$(sed -n 's|^URIs: *\(http[^ ]*/debian\)$|\1|p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
$SUDO debootstrap --variant=minbase bookworm "$root" "${mirror:-http://deb.debian.org/debian}" \
    > "$work/debootstrap.log" 2>&1 || { tail -5 "$work/debootstrap.log" >&2; fail "debootstrap"; }
in_root() { $SUDO chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive "$@"; }
for m in proc sys dev/shm; do
    case $m in proc) t=proc ;; sys) t=sysfs ;; *) t=tmpfs ;; esac
    $SUDO mount -t "$t" "$t" "$root/$m"
    mounted+=("$root/$m")
done
$SUDO cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
$SUDO cp "$deb" "$root/tmp/"
in_root apt-get update -qq
in_root apt-get install -y -qq "/tmp/$(basename "$deb")" > "$work/clean.log" 2>&1 ||
    { tail -5 "$work/clean.log" >&2; fail "apt-get install on a clean Debian 12"; }
in_root shardlm --version >&2
in_root sh -c 'cd / && shardlm generate -m /usr/share/shardlm/stories260K-w4a8.shlm -p "Once upon a time" -n 60 --temp 0 --no-persist' \
    > "$work/clean.txt" 2>"$work/err.txt" || fail "generate on a clean Debian 12: $(tail -1 "$work/err.txt")"
cmp -s "$work/want.txt" "$work/clean.txt" || fail "clean Debian 12: the text differs from the build tree's"
in_root apt-get purge -y -qq shardlm > "$work/clean.log" 2>&1 || fail "apt-get purge on a clean Debian 12"
for f in usr/bin/shardlm usr/libexec/shardlm usr/share/shardlm usr/share/doc/shardlm etc/shardlm; do
    [ -e "$root/$f" ] && fail "clean Debian 12: /$f left after purge"
done
echo "test_deb: clean Debian 12: installed, generated, purged with nothing left" >&2

# 2. this machine
echo "test_deb: apt-get install $deb" >&2
installed=1 # (a failed postinst leaves a half-configured package: purged all the same)
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$(realpath "$deb")" >/dev/null
dpkg-query -L shardlm | sort > "$work/files"
echo "test_deb: installed $(wc -l < "$work/files") paths; Depends: $(dpkg-query -W -f='${Depends}' shardlm)" >&2

# what an operator runs first: the version, the man page, a model converted and a story
/usr/bin/shardlm --version | grep -Eq '^shardlm [0-9]+\.[0-9]+\.[0-9]+ \(commit [^)]+\)$' ||
    fail "shardlm --version: '$(/usr/bin/shardlm --version)'"
# (read whole, not piped into grep -q: grep's early exit would kill zcat by SIGPIPE once the page
# outgrows one of its writes, and pipefail would call that a missing page)
zcat /usr/share/man/man1/shardlm.1.gz > "$work/shardlm.1" 2>/dev/null &&
    grep -q '^\.TH SHARDLM "1"' "$work/shardlm.1" || fail "no man page shardlm(1)"
[ -x /usr/libexec/shardlm/shardlm-worker ] || fail "no /usr/libexec/shardlm/shardlm-worker"
getent passwd shardlm >/dev/null || fail "no user shardlm"
[ -d /etc/shardlm ] || fail "no /etc/shardlm"
# an instance enabled as an operator would (systemctl works on the links without a running
# systemd): purge must take its link away
$SUDO systemctl enable shardlm@test.service >/dev/null 2>&1 || fail "systemctl enable shardlm@test"
link=/etc/systemd/system/multi-user.target.wants/shardlm@test.service
[ -L "$link" ] || fail "no $link after systemctl enable"

( cd / && /usr/bin/shardlm generate -m /usr/share/shardlm/stories260K-w4a8.shlm -p "$prompt" \
    -n 60 --temp 0 --no-persist ) > "$work/got.txt" 2>"$work/err.txt" ||
    fail "installed generate: $(tail -1 "$work/err.txt")"
cmp -s "$work/want.txt" "$work/got.txt" || fail "installed generate differs from the build tree's"
echo "test_deb: generate: $(head -c 80 "$work/got.txt")..." >&2
/usr/bin/shardlm convert /usr/share/shardlm/stories260K.bin --tokenizer /usr/share/shardlm/tok512.bin \
    --scheme w4a8 -q -o "$work/m.shlm" || fail "installed convert"
chmod 644 "$work/m.shlm"
# the service user, through its own default runtime folder (/dev/shm/shardlm-<uid>)
$SUDO runuser -u shardlm -- env -u SHARDLM_RUNTIME_DIR /usr/bin/shardlm generate -m "$work/m.shlm" \
    -p "$prompt" -n 60 --temp 0 > "$work/user.txt" 2>"$work/err.txt" ||
    fail "generate as the user shardlm: $(tail -1 "$work/err.txt")"
cmp -s "$work/want.txt" "$work/user.txt" || fail "the user shardlm's text differs"
uid=$(id -u shardlm)
[ -d "/dev/shm/shardlm-$uid" ] || fail "no /dev/shm/shardlm-$uid after the user's generate"
unset SHARDLM_RUNTIME_DIR

echo "test_deb: apt-get purge shardlm" >&2
DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -qq shardlm >/dev/null
installed=0
left=0
while read -r f; do
    # folders other packages share (/usr/bin, /usr/share/man/man1, ...) stay; files must not
    if [ -e "$f" ] && ! [ -d "$f" ]; then echo "test_deb: left behind: $f" >&2; left=1; fi
done < "$work/files"
for d in /usr/libexec/shardlm /usr/share/shardlm /usr/share/doc/shardlm /etc/shardlm "/dev/shm/shardlm-$uid" "$link"; do
    if [ -e "$d" ] || [ -L "$d" ]; then echo "test_deb: left behind: $d" >&2; left=1; fi
done
dpkg-query -W -f='${Status}' shardlm 2>/dev/null | grep -q "ok installed" && fail "still installed after purge"
[ "$left" = 0 ] || fail "purge left files behind"
echo "test_deb: ok: installed, generated, purged with nothing left" >&2
