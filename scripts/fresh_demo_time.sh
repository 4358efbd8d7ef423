#!/usr/bin/env bash
# Measures the README's demo command from a fresh clone on a fresh Debian 12
# machine: a debootstrap chroot with the base system only (none of vipsd's
# packages), a copy of this checkout's files (what git tracks, and what it
# does not ignore), then scripts/demo.sh inside it with every output line
# stamped with the seconds since it started. Prints the time to the first
# step line. Needs root (chroot, mount) and network access to a Debian
# mirror; installs debootstrap on the host if it is missing.
#   scripts/fresh_demo_time.sh [WORK_DIR]   (default out/fresh_demo)
# WORK_DIR/base is the pristine base system, made once and kept;
# WORK_DIR/run the chroot of this measurement (replaced every time);
# WORK_DIR/demo.log the stamped output.
set -uo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:-out/fresh_demo}")
[[ $(id -u) -eq 0 ]] || { echo "fresh_demo_time.sh: needs root (chroot, mount)" >&2; exit 2; }
mkdir -p "$work"
if [[ ! -x $work/base/bin/bash ]]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  echo "fresh_demo_time: debootstrap bookworm into $work/base (once)"
  debootstrap bookworm "$work/base" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
    { tail -5 "$work/debootstrap.log"; exit 1; }
fi
root=$work/run
unmount() { umount -R "$root/proc" "$root/sys" "$root/dev" 2>/dev/null || true; }
unmount
rm -rf "$root"
cp -a "$work/base" "$root"
trap unmount EXIT
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mkdir -p "$root/root/vipsd"
git ls-files -co --exclude-standard | grep -v '^out/' | tar -T - -cf - | tar -xf - -C "$root/root/vipsd"
echo "fresh_demo_time: running scripts/demo.sh in $root (output stamped in $work/demo.log)"
chroot "$root" /bin/bash -c \
  'cd /root/vipsd && export HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin && scripts/demo.sh' 2>&1 |
  python3 -u -c '
import sys, time
start = time.monotonic()
for line in sys.stdin:
    sys.stdout.write("%8.1f %s" % (time.monotonic() - start, line))
    sys.stdout.flush()' >"$work/demo.log"
status=${PIPESTATUS[0]}
grep -E '^ *[0-9.]+ == \[' "$work/demo.log"
first=$(grep -m1 -E 'msg="step=' "$work/demo.log" | awk '{print $1}')
echo "fresh_demo_time: demo exit status $status; first step line after ${first:-(none)} s"
[[ $status -eq 0 && -n $first ]]
