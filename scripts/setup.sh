#!/usr/bin/env bash
# edgehop machine setup: idempotent. Installs what edgehop needs on a fresh
# Debian 12 machine: runc, iptables, iproute2, debootstrap, podman, and
# CRIU >= 4.2 built from Debian's source into $CRIU_PREFIX (default /opt/criu).
set -euo pipefail

CRIU_PREFIX=${CRIU_PREFIX:-/opt/criu}
CRIU_MIN=${CRIU_MIN:-4.2}
STAMP_DIR=${EDGEHOP_STATE:-/var/lib/edgehop}
say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (namespaces, CRIU and runc need it); re-run with sudo"
command -v apt-get >/dev/null || die "apt-get not found: edgehop setup supports Debian 12 machines"

PKGS=(runc iptables iproute2 debootstrap busybox-static podman rsync uidmap ca-certificates
      build-essential pkg-config libbsd-dev libcap-dev libgnutls28-dev libnet1-dev
      libnftables-dev libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler
      protobuf-compiler uuid-dev python3-protobuf dpkg-dev kmod util-linux iputils-ping chromium
      wrk)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
apt_updated=0
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  apt_updated=1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "Debian packages present"
fi

ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
criu_version() { "$1" --version 2>/dev/null | awk '/^Version:/ {print $2}'; }

criu_ok=""
for c in "$CRIU_PREFIX/sbin/criu" "$(command -v criu || true)"; do
  [ -n "$c" ] && [ -x "$c" ] || continue
  v=$(criu_version "$c" || true)
  if [ -n "$v" ] && ver_ge "$v" "$CRIU_MIN"; then criu_ok=$c; break; fi
done

if [ -z "$criu_ok" ]; then
  say "building CRIU >= $CRIU_MIN from Debian sid source into $CRIU_PREFIX"
  src_list=/etc/apt/sources.list.d/edgehop-sid-src.sources
  if [ ! -f "$src_list" ]; then
    cat >"$src_list" <<EOS
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOS
    apt_updated=0
  fi
  [ $apt_updated = 1 ] || apt-get update -qq
  build=$(mktemp -d /tmp/edgehop-criu.XXXXXX)
  ( cd "$build" && apt-get source -qq --tar-only criu >/dev/null ) || die "could not fetch CRIU source from Debian sid (network to deb.debian.org?)"
  tarball=$(ls "$build"/criu_*.orig.tar.* | head -n1)
  [ -n "$tarball" ] || die "no CRIU source tarball downloaded"
  tar -C "$build" -xf "$tarball"
  dir=$(find "$build" -maxdepth 1 -type d -name 'criu-*' | head -n1)
  say "compiling $(basename "$dir") (about a minute on 2 cores)"
  make -C "$dir" -j"$(nproc)" criu >"$build/build.log" 2>&1 || { tail -n 30 "$build/build.log" >&2; die "CRIU build failed; log in $build/build.log"; }
  make -C "$dir" install-criu PREFIX="$CRIU_PREFIX" >>"$build/build.log" 2>&1 || die "CRIU install failed; log in $build/build.log"
  criu_ok="$CRIU_PREFIX/sbin/criu"
  v=$(criu_version "$criu_ok")
  ver_ge "$v" "$CRIU_MIN" || die "built CRIU $v is older than $CRIU_MIN"
  rm -rf "$build"
else
  say "CRIU $(criu_version "$criu_ok") at $criu_ok"
fi
# runc looks CRIU up on PATH; make ours the one it finds.
if [ "$criu_ok" != /usr/local/sbin/criu ]; then ln -sf "$criu_ok" /usr/local/sbin/criu; fi

# Post-copy (lazy pages) needs pipes larger than the 1 MiB default.
cur=$(cat /proc/sys/fs/pipe-max-size)
if [ "$cur" -lt 4194304 ]; then
  say "raising fs.pipe-max-size $cur -> 4194304 (CRIU lazy-pages)"
  sysctl -q -w fs.pipe-max-size=4194304
fi
# CRIU's frozen window. Every mount CRIU detaches (a cgroup hierarchy per
# controller, a private copy of every tmpfs) waits for an RCU grace period,
# and every dump walks the whole host-wide conntrack hash twice. Measured
# here: about 80 ms of each migration's downtime. Not persistent: setup
# runs again before every demo and test run.
if [ -w /sys/kernel/rcu_expedited ] && [ "$(cat /sys/kernel/rcu_expedited)" = 0 ]; then
  say "expediting RCU grace periods (/sys/kernel/rcu_expedited = 1; CRIU's mounts)"
  echo 1 >/sys/kernel/rcu_expedited
fi
ct=/proc/sys/net/netfilter/nf_conntrack_buckets
[ -e "$ct" ] || modprobe -q nf_conntrack 2>/dev/null || true
if [ -w "$ct" ] && [ "$(cat "$ct")" -gt 16384 ]; then
  say "shrinking the conntrack hash $(cat "$ct") -> 16384 buckets (CRIU walks it twice per dump)"
  echo 16384 >"$ct"
fi
# NFQUEUE delay emulation and bridge/vxlan need these modules where they are modules.
for m in nfnetlink_queue xt_NFQUEUE vxlan bridge veth sch_tbf sch_htb ifb; do modprobe -q "$m" 2>/dev/null || true; done

say "criu check"
"$criu_ok" check >/tmp/edgehop-criu-check.log 2>&1 || { cat /tmp/edgehop-criu-check.log >&2; die "criu check failed"; }
command -v runc >/dev/null || die "runc missing after install"
mkdir -p "$STAMP_DIR"
say "ok: criu $(criu_version "$criu_ok"), $(runc --version | head -n1)"
