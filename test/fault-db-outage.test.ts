import { stoppedDatabaseTests } from './helpers/db-outage.js'

// PostgreSQL stopped under load, and started again (test/helpers/db-outage.ts says what must hold).
stoppedDatabaseTests()
