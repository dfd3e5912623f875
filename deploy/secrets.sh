#!/bin/sh
# Writes the secrets compose.yaml reads into ./secrets/ beside it, each made
# up here at random; one that exists is kept, so running this again changes
# nothing. The folder is yours alone (0700); the files in it are readable by
# any account, so that the containers' own (the service's is uid 1000, not
# yours) can read what compose mounts. docs/deployment.md, "Secrets".
#
# The TLS certificate made here is self-signed, for trying the stack out on
# this machine: put your real chain and key in secrets/tls/ instead.
set -eu
cd "$(dirname "$0")/.."
umask 022
mkdir -p secrets/tls
chmod 700 secrets

# Hex: safe as it is inside a URL.
random() { openssl rand -hex "$1"; }
missing() {
  if [ -e "secrets/$1" ]; then echo "secrets/$1: exists, kept"; return 1; fi
  echo "secrets/$1: written"
}

if missing postgres_password; then
  password=$(random 24)
  printf '%s' "$password" > secrets/postgres_password
  # The same password: migrations run as the owner PostgreSQL creates with it.
  printf 'postgres://api:%s@db:5432/api' "$password" > secrets/database_migration_url
fi
if missing runtime_db_password; then
  password=$(random 24)
  printf '%s' "$password" > secrets/runtime_db_password
  # The same password: the service serves as the role deploy/postgres/runtime-role.sh creates with it.
  printf 'postgres://api_runtime:%s@db:5432/api' "$password" > secrets/database_url
fi
if missing jwt_secrets; then
  printf 'k1:%s' "$(random 32)" > secrets/jwt_secrets
fi
if missing tls/fullchain.pem; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -keyout secrets/tls/privkey.pem -out secrets/tls/fullchain.pem \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null
fi
chmod 444 secrets/postgres_password secrets/database_migration_url secrets/runtime_db_password secrets/database_url secrets/jwt_secrets secrets/tls/fullchain.pem secrets/tls/privkey.pem
