#!/bin/sh
# build.sh [EDGEHOP]: builds the notes stack's root file system from Debian
# bookworm (PostgreSQL 15, Python 3 with psycopg2), packs it as two
# `docker save` tarballs (pgdb, notes) and imports them into edgehop's
# image cache. Needs root, debootstrap and the Debian mirror.
set -eu
EH=${1:-edgehop}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/notes-stack.XXXXXX)
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=postgresql,python3,python3-psycopg2 \
	bookworm "$work/rootfs" http://deb.debian.org/debian
r=$work/rootfs
mkdir -p "$r/app" "$r/var/lib/postgresql/data" "$r/run/postgresql"
install -m 0755 "$here/app.py" "$r/app/app.py"
install -m 0755 "$here/db-entrypoint.sh" "$r/db-entrypoint.sh"
chroot "$r" chown postgres:postgres /var/lib/postgresql/data /run/postgresql
chmod 0700 "$r/var/lib/postgresql/data"
rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/*
python3 "$here/pack.py" "$r" "$work/IMG.tar"
"$EH" image import pgdb "$work/pgdb.tar"
"$EH" image import notes "$work/notes.tar"
