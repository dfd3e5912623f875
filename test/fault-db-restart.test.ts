import { restartedAndFrozenDatabaseTests } from './helpers/db-outage.js'

// PostgreSQL restarted under transactional writes, and frozen (test/helpers/db-outage.ts says what must hold).
restartedAndFrozenDatabaseTests()
