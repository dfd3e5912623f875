import type { AppModule } from '../app-module.js'
import { resourceModule } from '../resource-module.js'
import { factorRemovalRoute } from './factor-removal.js'
import { meRoute } from './me.js'
import { userHooks, users } from './resource.js'

const operations = resourceModule(users, {
  access: { list: { who: 'admin' }, create: { who: 'admin', signup: true } },
  hooks: userHooks,
  summaries: {
    replace: "Replace a user's name and e-mail (role and password only when given)",
    delete: 'Delete a user, its sessions and its API keys',
  },
})

/**
 * Users: the resource, GET /auth/me, an admin's removal of a user's second factor, and the rule that one admin
 * always remains.
 */
export const usersModule: AppModule = {
  name: 'users',
  resources: [operations],
  routes: [meRoute, factorRemovalRoute],
  problems: {
    last_admin: { status: 409, title: 'The last admin cannot be removed' },
    no_local_password: { status: 409, title: 'This user has no local password' },
  },
}
