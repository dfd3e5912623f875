# Everything a fresh machine needs is done by `make run` and `make test`.
# DATABASE_URL unset: a local PostgreSQL cluster in .data/ is created/started.

NODE_BIN := node_modules/.bin
TSX := node --import tsx

.PHONY: run test build migrate admin typecheck db-start db-stop clean bench

# Installs exactly what package-lock.json says, and patches postgres.js (postinstall);
# re-runs when either changes, or the patch does.
node_modules/.installed: package.json package-lock.json src/db/postgres-patch.mjs
	npm ci --no-audit --no-fund
	@touch $@

run: node_modules/.installed
	$(TSX) src/main.ts

migrate: node_modules/.installed
	$(TSX) src/main.ts migrate

# Creates an admin, or gives an existing admin a new password (ending its sessions):
#   make admin EMAIL=you@example.com
# The password comes from ADMIN_PASSWORD or standard input (never the command
# line, where ps shows it); without either a generated one is printed. An
# existing account that is not an admin is not promoted.
admin: node_modules/.installed
	@$(TSX) src/main.ts admin "$(EMAIL)"

typecheck: node_modules/.installed
	$(NODE_BIN)/tsc --noEmit -p test/tsconfig.json
	$(NODE_BIN)/tsc --noEmit -p bench/tsconfig.json

# Type-check, then the whole node:test suite against a database of its own.
test: typecheck
	$(TSX) test/run.ts

build: node_modules/.installed
	rm -rf dist
	$(NODE_BIN)/tsc -p tsconfig.json

# The service (production build) against a bare baseline, on a benchmark database of its own
# (upa_bench_<rows>, dropped afterwards). Options: BENCH_ROWS=1000000, BENCH_GROWTH=full|off,
# BENCH_DURATION, BENCH_ROUNDS; see bench/README.md.
bench: build
	$(TSX) bench/run.ts

db-start: node_modules/.installed
	$(TSX) src/db/local-cluster.ts start

db-stop: node_modules/.installed
	$(TSX) src/db/local-cluster.ts stop

clean: db-stop
	rm -rf dist .data node_modules
