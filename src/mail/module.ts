import type { Sql } from 'postgres'
import type { AppModule } from '../app-module.js'
import { purgeJob } from '../core/db/batched-delete.js'
import { oldFailedMail } from './outbox.js'
import type { MailWorker } from './worker.js'

/** Sending the mail outbox (recovery and verification messages), and forgetting what failed long ago. */
export const mailModule: AppModule<{ mail: MailWorker; maintenanceSql: Sql }> = {
  name: 'mail',
  components: (s) => [s.mail],
  jobs: (s) => [
    ...s.mail.jobs,
    purgeJob({ name: 'mail.purge-failed', table: 'mail_outbox', where: oldFailedMail, sql: s.maintenanceSql }),
  ],
}
