#!/usr/bin/env bash
# Start a throwaway PostgreSQL for the test suite and print its URL on stdout (nothing else goes to stdout).
#
#   export CORRAL_TEST_POSTGRES_URL=$(bash scripts/postgres.sh)
#
# Installs Debian's postgresql package if no server binaries are present, initdb's a cluster under
# /var/lib/corral-test-pg (owned by the postgres user), and starts it with pg_ctl -- no systemd, no pg_ctlcluster --
# listening on 127.0.0.1:55432 only. Creates the role and database `corral` (password `corral`; the role may create
# databases, so tests can make one per test). The cluster trades durability for speed (fsync off): it holds test
# data only. A second run while the server is up only prints the URL.
#
# Environment: CORRAL_TEST_PG_PORT (default 55432), CORRAL_TEST_PG_DIR (default /var/lib/corral-test-pg).
set -euo pipefail

port=${CORRAL_TEST_PG_PORT:-55432}
base=${CORRAL_TEST_PG_DIR:-/var/lib/corral-test-pg}
data=$base/data
ready=$base/ready   # written once the role and database exist, so an interrupted first run is finished next time
url="postgresql://corral:corral@127.0.0.1:${port}/corral"

log() { printf '[postgres] %s\n' "$*" >&2; }
die() { printf '[postgres] error: %s\n' "$*" >&2; exit 1; }

# The newest installed server's binaries (Debian keeps them off PATH, under /usr/lib/postgresql/VERSION/bin).
find_bin() {
    local ctl
    ctl=$(ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -n 1)
    [ -n "$ctl" ] && dirname "$ctl"
    return 0
}

# Fast path: our cluster is up and set up.
bin=$(find_bin)
if [ -n "$bin" ] && [ -f "$ready" ] && [ -f "$data/postmaster.pid" ] \
        && "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2; then
    echo "$url"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "run as root the first time: it installs packages and runs the server as 'postgres'"

if [ -z "$bin" ]; then
    command -v apt-get >/dev/null || die "no PostgreSQL server found and no apt-get to install one"
    log "installing postgresql"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
    bin=$(find_bin)
    [ -n "$bin" ] || die "postgresql installed but no server binaries under /usr/lib/postgresql/*/bin"
fi
id postgres >/dev/null 2>&1 || die "the postgresql package did not create the 'postgres' user"

# Server commands run as postgres from a directory it can read (runuser keeps root's cwd otherwise).
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

if [ ! -s "$data/PG_VERSION" ]; then
    log "creating a cluster in $data"
    rm -f "$ready"
    install -d -o postgres -g postgres -m 0700 "$base" "$data"
    # Local (socket) connections trust the OS user; TCP needs a password. No superuser password is set.
    as_postgres "$bin/initdb" -D "$data" -U postgres -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 --no-sync >/dev/null
fi
chown postgres:postgres "$base"

if ! "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 1; then
    log "starting the server on 127.0.0.1:$port"
    # Options on the command line, not in postgresql.conf, so a changed port takes effect on the next start.
    # fsync and friends are off: this cluster only ever holds test data, and they make CREATE DATABASE fast.
    as_postgres "$bin/pg_ctl" -D "$data" -l "$base/server.log" -s -w -t 60 start -o \
        "-c listen_addresses=127.0.0.1 -p $port -k $base -c fsync=off -c synchronous_commit=off \
-c full_page_writes=off -c max_connections=200" >&2 \
        || die "the server did not start; see $base/server.log"
fi

psql_admin() { as_postgres "$bin/psql" -h "$base" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }

if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = 'corral'")" != 1 ]; then
    log "creating role corral"
    psql_admin -c "CREATE ROLE corral LOGIN CREATEDB PASSWORD 'corral'"
else
    psql_admin -c "ALTER ROLE corral LOGIN CREATEDB PASSWORD 'corral'"
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = 'corral'")" != 1 ]; then
    log "creating database corral"
    psql_admin -c "CREATE DATABASE corral OWNER corral"
fi
touch "$ready"
echo "$url"
