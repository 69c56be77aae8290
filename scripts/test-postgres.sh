#!/usr/bin/env bash
# A PostgreSQL server on 127.0.0.1 for the multi-worker tests (a study shared by several tuners).
#
# Idempotent and quick when it already runs: installs Debian's `postgresql` only when missing,
# creates a cluster named `autotune` once (its own port, loopback only, so a system cluster is
# left alone), starts it when it is down, and creates the role and database when they are absent.
# Runs as root (CI) or as a user who may `sudo -u postgres`.
#
#   AUTOTUNE_PG_PORT  port of the test cluster  (default 55432)
#
# The tests read AUTOTUNE_TEST_PG_URL=postgresql+psycopg2://autotune:autotune@127.0.0.1:$PORT/autotune.
set -euo pipefail

PORT="${AUTOTUNE_PG_PORT:-55432}"
CLUSTER=autotune

as_root() { if [[ "$(id -u)" == 0 ]]; then "$@"; else sudo -- "$@"; fi; }
as_postgres() { if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else sudo -u postgres -- "$@"; fi; }

if ! command -v pg_createcluster >/dev/null; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi

# `pg_lsclusters -h`: version, name, port, status, owner, data dir, log file.
line="$(pg_lsclusters -h | awk -v c="$CLUSTER" '$2 == c')"
if [[ -z "$line" ]]; then
  version="$(ls /usr/lib/postgresql | sort -V | tail -1)"
  as_root pg_createcluster --port "$PORT" "$version" "$CLUSTER" >/dev/null
  echo "listen_addresses = '127.0.0.1'" | as_root tee "/etc/postgresql/$version/$CLUSTER/conf.d/loopback.conf" >/dev/null
  line="$(pg_lsclusters -h | awk -v c="$CLUSTER" '$2 == c')"
fi
read -r version _ port status _ <<<"$line"
if [[ "$port" != "$PORT" ]]; then
  echo "test-postgres: cluster $version/$CLUSTER listens on $port, not $PORT; set AUTOTUNE_PG_PORT=$port" >&2
  exit 1
fi
if [[ "$status" != online* ]]; then
  as_root pg_ctlcluster "$version" "$CLUSTER" start
fi

psql_q() { as_postgres psql -p "$PORT" -h /var/run/postgresql -qtAX -c "$1"; }
if [[ "$(psql_q "SELECT 1 FROM pg_roles WHERE rolname = 'autotune'")" != 1 ]]; then
  psql_q "CREATE ROLE autotune LOGIN PASSWORD 'autotune'"
fi
if [[ "$(psql_q "SELECT 1 FROM pg_database WHERE datname = 'autotune'")" != 1 ]]; then
  psql_q "CREATE DATABASE autotune OWNER autotune"
fi
