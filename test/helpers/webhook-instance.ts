import { loadConfig } from '../../src/config.js'
import { resolvePooler } from '../../src/core/db/pooler.js'
import { createLogger } from '../../src/core/log.js'
import { createService } from '../../src/service.js'
import type { WebhookSettings } from '../../src/webhooks/worker.js'

// One more service instance in a process of its own, for a test that kills it
// (SIGKILL) in the middle of a webhook delivery: createService on
// DATABASE_URL with the webhook tuning in WEBHOOK_TUNING (JSON). Its log goes
// to stdout, one JSON object a line, after a first line `{"msg":"listening","port":…}`.

const loaded = { ...loadConfig(process.env), databaseUrl: process.env.DATABASE_URL! }
const config = { ...loaded, databasePooler: await resolvePooler(loaded) }
const tuning = JSON.parse(process.env.WEBHOOK_TUNING ?? '{}') as Partial<WebhookSettings>
const log = createLogger(config.logLevel, (line) => void process.stdout.write(line))
const service = createService(config, { log, webhooks: tuning })
const { port } = await service.listen(0, '127.0.0.1')
log.info('listening', { port })
