#!/usr/bin/env bash
# Install (if needed) and start a local PostgreSQL server for the shared-study test, then print
# the URL to use. Debian's package; the server listens on localhost only.
#   export AUTOFUSE_TEST_POSTGRES_URL=$(bash scripts/start_postgres.sh)
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
fi
version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$version main$"; then
    pg_createcluster "$version" main >&2
fi
pg_ctlcluster "$version" main start >&2 2>/dev/null || true
for _ in $(seq 1 30); do
    pg_isready -q -h localhost && break
    sleep 1
done
as_pg() { runuser -u postgres -- "$@"; }
as_pg psql -qtAc "SELECT 1 FROM pg_roles WHERE rolname='autofuse'" | grep -q 1 ||
    as_pg psql -qc "CREATE ROLE autofuse LOGIN PASSWORD 'autofuse'" >&2
as_pg psql -qtAc "SELECT 1 FROM pg_database WHERE datname='autofuse_test'" | grep -q 1 ||
    as_pg createdb -O autofuse autofuse_test >&2
echo "postgresql://autofuse:autofuse@localhost:5432/autofuse_test"
