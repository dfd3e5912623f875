#!/usr/bin/env bash
# The service's runtime role (runtime-role.psql beside this file), made when
# the official postgres image initializes its data folder: this folder is
# mounted as /docker-entrypoint-initdb.d, where the image runs every *.sh and
# *.sql once, as POSTGRES_USER on POSTGRES_DB (the .psql script is not run by
# itself: it needs its variables). Also runnable by hand with the same
# variables and PG* for the connection.
#
#   RUNTIME_DB_USER            the role (default api_runtime)
#   RUNTIME_DB_PASSWORD_FILE   a file holding its password (a Docker or
#                              Kubernetes secret), or
#   RUNTIME_DB_PASSWORD        the password itself; one of them is required
set -Eeuo pipefail

fail() { echo "runtime-role.sh: $*" >&2; exit 1; }
if [ -n "${RUNTIME_DB_PASSWORD_FILE:-}" ]; then
  [ -z "${RUNTIME_DB_PASSWORD:-}" ] || fail 'set RUNTIME_DB_PASSWORD or RUNTIME_DB_PASSWORD_FILE, not both'
  [ -r "$RUNTIME_DB_PASSWORD_FILE" ] || fail "RUNTIME_DB_PASSWORD_FILE: cannot read $RUNTIME_DB_PASSWORD_FILE"
  # $(<file) drops the trailing newline an editor or `echo` leaves in a secret file.
  RUNTIME_DB_PASSWORD="$(<"$RUNTIME_DB_PASSWORD_FILE")"
fi
[ -n "${RUNTIME_DB_PASSWORD:-}" ] || fail "set RUNTIME_DB_PASSWORD_FILE (or RUNTIME_DB_PASSWORD): the password of role ${RUNTIME_DB_USER:-api_runtime}, which the service's DATABASE_URL names"
# The password reaches psql in its environment, never its command line (ps shows that).
export RUNTIME_DB_PASSWORD

psql --no-psqlrc -v ON_ERROR_STOP=1 \
  ${POSTGRES_USER:+--username "$POSTGRES_USER"} ${POSTGRES_DB:+--dbname "$POSTGRES_DB"} \
  -v runtime_role="${RUNTIME_DB_USER:-api_runtime}" \
  -f "$(dirname "${BASH_SOURCE[0]}")/runtime-role.psql"
