#!/bin/sh
# Like the usual postgres images: initialise the volume on first start.
set -e
PGDATA=/var/lib/postgresql/data
BIN=/usr/lib/postgresql/15/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	$BIN/initdb -D "$PGDATA" --auth=trust -U postgres >/dev/null
	echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
	echo "host all all 0.0.0.0/0 trust" >> "$PGDATA/pg_hba.conf"
	$BIN/pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
	$BIN/psql -U postgres -c "create role app login" -c "create database app owner app" >/dev/null
	$BIN/pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec $BIN/postgres -D "$PGDATA"
