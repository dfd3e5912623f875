# Everything a fresh machine needs is done by `make run` and `make test`.
# DATABASE_URL unset: a local PostgreSQL cluster in .data/ is created/started.

# `make admin` names the admin to make: without EMAIL it says so before anything runs (no install, no database).
ifneq ($(filter admin,$(MAKECMDGOALS)),)
ifeq ($(strip $(EMAIL)),)
$(error usage: make admin EMAIL=you@example.com (the password from ADMIN_PASSWORD or standard input, else one is generated))
endif
endif

# The Node.js every recipe runs on (npm ci included): NODE_LINE=22, 24 or 26 picks a supported release
# line; without it, this machine's node when its line is supported, else the active LTS. A line the machine
# lacks is fetched from the npm registry, checked against its pinned integrity and cached outside the
# checkout (src/dev/node-line.mjs, which prints its folder, or nothing for the machine's node).
NODE_DIR := $(shell node src/dev/node-line.mjs $(NODE_LINE) || echo '!')
ifeq ($(NODE_DIR),!)
$(error no supported Node.js to run on (why: above). Supported: 22, 24, 26 (README.md, "Node.js"))
endif
ifneq ($(NODE_DIR),)
# npm run by another Node looks for its global configuration (registry, CA) beside that Node: keep this machine's.
export NPM_CONFIG_GLOBALCONFIG := $(or $(NPM_CONFIG_GLOBALCONFIG),$(shell npm config get globalconfig))
export PATH := $(NODE_DIR):$(PATH)
endif

NODE_BIN := node_modules/.bin
TSX := node --import tsx

.PHONY: run test test-repeat build migrate admin typecheck fmt fmt-check db-start db-stop clean bench bench-faults test-tools bench-tools

# Debian packages the tests and the benchmark run for real: installed when missing, as root with
# apt-get (which needs `apt-get update` first on a fresh machine); otherwise the command to run is printed.
#   $(call debian-tools,<command> <package> ...,<what needs them>)
define debian-tools
@missing=""; set -- $(1); while [ $$# -gt 0 ]; do \
  command -v $$1 >/dev/null || [ -x /usr/sbin/$$1 ] || missing="$$missing $$2"; shift 2; done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    echo "installing$$missing (Debian packages, for $(2))"; \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
  else echo "$(2) need$$missing: run apt-get install$$missing as root (Debian, Ubuntu), or install them from your system's packages" >&2; exit 1; fi; \
fi
endef

# Installs exactly what package-lock.json says, and patches postgres.js (postinstall);
# re-runs when either changes, or the patch does.
node_modules/.installed: package.json package-lock.json src/driver-patch/postgres.mjs
	npm ci --no-audit --no-fund
	@touch $@

run: node_modules/.installed
	$(TSX) src/main.ts

migrate: node_modules/.installed
	$(TSX) src/main.ts migrate

# One line per target; test/makefile.test.ts holds every .PHONY target to a line here.
.PHONY: help
help:
	@printf '%s\n' \
	  'make run             install dependencies, start a local PostgreSQL if DATABASE_URL is unset, migrate, serve' \
	  'make test            the same set-up, then check formatting, type-check and run the whole node:test suite' \
	  'make test-repeat     the suite N times (N=5), then every test that failed in any run (FILES=... for some)' \
	  'make build           compile to dist/ (then: node dist/main.js --help)' \
	  'make migrate         apply pending migrations and exit' \
	  'make admin EMAIL=…   create an admin or reset its password (ADMIN_PASSWORD or standard input, else generated)' \
	  'make typecheck       tsc --noEmit over src/, test/ and bench/' \
	  'make fmt             format the code with prettier' \
	  'make fmt-check       check that the code is formatted' \
	  'make db-start        start the local development cluster (.data/)' \
	  'make db-stop         stop it' \
	  'make clean           stop the cluster, remove dist/, .data/ and node_modules/' \
	  'make bench           the benchmark against Fastify and bare node:http peers (bench/README.md)' \
	  'make bench-faults    the figures under faults beside their baselines (bench/README.md)' \
	  'make test-tools      install what the proxy, pooler and SMTP tests run (nginx, pgbouncer, exim4)' \
	  'make bench-tools     install wrk, the load generator of make bench' \
	  'make help            this list'

# Creates an admin, or gives an existing admin a new password (ending its sessions):
#   make admin EMAIL=you@example.com
# The password comes from ADMIN_PASSWORD or standard input (never the command
# line, where ps shows it) and is never printed back; without either a
# generated one is printed. An existing account that is not an admin is not promoted.
admin: node_modules/.installed
	@$(TSX) src/main.ts admin "$(EMAIL)"

# Incremental: what was checked and has not changed since is not checked again (CI checks once per Node line).
typecheck: node_modules/.installed
	$(NODE_BIN)/tsc --noEmit --incremental --tsBuildInfoFile .data/tsc-test.tsbuildinfo -p test/tsconfig.json
	$(NODE_BIN)/tsc --noEmit --incremental --tsBuildInfoFile .data/tsc-bench.tsbuildinfo -p bench/tsconfig.json

# The code's layout is prettier's (.prettierrc.json): `make fmt` rewrites, `make test` checks. Lines stay within 120
# characters; what prettier cannot break (comments, long literals) test/line-width.test.ts holds.
FORMATTED := 'src/**/*.{ts,mts,mjs}' 'test/**/*.{ts,mjs}' 'bench/**/*.{ts,mjs,js}'

fmt: node_modules/.installed
	$(NODE_BIN)/prettier --write --log-level warn $(FORMATTED)

fmt-check: node_modules/.installed
	@$(NODE_BIN)/prettier --check --log-level warn $(FORMATTED) || { echo 'not formatted: run make fmt' >&2; exit 1; }

# nginx (the reverse proxy of deploy/nginx.conf), PgBouncer and exim (a mail server), which the proxy, pooler and SMTP
# tests run, and Prometheus (its package carries promtool), which test/alerts.test.ts runs against deploy/prometheus/.
test-tools:
	$(call debian-tools,nginx nginx pgbouncer pgbouncer exim4 exim4-daemon-light prometheus prometheus,the proxy and pooler tests and the SMTP and alert tests)

# Type-check, then the whole node:test suite against a database of its own.
test: fmt-check typecheck test-tools
	$(TSX) test/run.ts

# The suite N times in a row (default 5), then the flake ledger: each test that failed in any run, and in
# how many (test/repeat.ts); non-zero when one did. FILES="test/a.test.ts ..." repeats only those files.
test-repeat: typecheck test-tools
	$(TSX) test/repeat.ts $(or $(N),5) $(FILES)

build: node_modules/.installed
	rm -rf dist
	$(NODE_BIN)/tsc -p tsconfig.json

# The service (production build) against three independent peers, a Fastify server doing its work
# (bench/fastify), the minimal idiomatic Fastify server (bench/fastify-minimal) and a bare node:http
# one (bench/bare), on a benchmark database of its own
# (upa_bench_<rows>, dropped afterwards), with wrk as the load generator. Options: BENCH_ROWS=1000000,
# BENCH_GROWTH=full|off, BENCH_DURATION, BENCH_ROUNDS, BENCH_CONCURRENCY; see bench/README.md.
# The open-file limit is raised for the 1,000-connection runs (Node lifts its soft limit to the hard one).
# Then bench/topology.ts: nginx, 1 to 3 instances, PgBouncer and PostgreSQL (BENCH_TOPOLOGY=off skips it).
bench: build bench-tools test-tools bench/fastify/node_modules/.installed bench/fastify-minimal/node_modules/.installed bench/bare/node_modules/.installed
	ulimit -n 65536 2>/dev/null || true; $(TSX) bench/run.ts && $(TSX) bench/topology.ts

# The figures the fault tests do not assert (latencies, percentiles, the wait against its target, answers
# during a drain, recovery times), each beside a baseline from the same run, on PostgreSQL clusters of its
# own (and DATABASE_URL's server or the local cluster where a section needs no faults); printed and written
# into bench/README.md ("Under faults"). BENCH_FAULTS_ONLY=hostile,shutdown runs only those sections.
bench-faults: build
	ulimit -n 65536 2>/dev/null || true; $(TSX) bench/faults.ts

# Each peer has its own package.json and lock (the published postgres.js, not the root's patched copy).
bench/%/node_modules/.installed: bench/%/package.json bench/%/package-lock.json
	cd bench/$* && npm ci --no-audit --no-fund
	@touch $@

# wrk, the load generator.
bench-tools:
	$(call debian-tools,wrk wrk,make bench)

db-start: node_modules/.installed
	$(TSX) src/dev/local-cluster.ts start

db-stop: node_modules/.installed
	$(TSX) src/dev/local-cluster.ts stop

# Stops the local cluster (and deletes it when it lives outside the checkout, src/dev/local-cluster.ts).
clean: node_modules/.installed
	$(TSX) src/dev/local-cluster.ts remove
	rm -rf dist .data node_modules
