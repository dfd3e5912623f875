# The service's image: a build stage compiles the TypeScript; the runtime
# stage holds only dist/, sql/, the package files, the driver patch and the
# two runtime dependencies, and runs as an unprivileged account given by
# number (the image's `node` user, 1000), which Kubernetes' runAsNonRoot can
# check; the files it runs are root's, so the service cannot change them.
# Node 26 is the active LTS; the suite passes on 22, 24 and 26, the supported
# lines (docs/deployment.md). test/dockerfile.test.ts runs this file's install,
# start and health-check steps, since no container engine runs where we test.
# docs/deployment.md explains every step.

FROM node:26-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
COPY src/driver-patch/postgres.mjs src/driver-patch/postgres.mjs
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY src src
RUN npx tsc -p tsconfig.json

FROM node:26-bookworm-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
# npm ci runs it (postinstall) to patch postgres.js, and the service checks the patch against it at start-up.
COPY src/driver-patch/postgres.mjs src/driver-patch/postgres.mjs
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist dist
COPY sql sql
USER 1000:1000
EXPOSE 3000
STOPSIGNAL SIGTERM
# Liveness, asked the way the service is configured (PORT, HOST, API_PREFIX,
# TLS_CERT_FILE: src/healthcheck.ts); no database, so an outage of it does not
# get healthy containers restarted. The slim image has no curl, and needs none.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "dist/main.js", "healthcheck"]
CMD ["node", "dist/main.js"]
