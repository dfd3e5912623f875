import { resourceModule } from '../resource-module.js'
import { meRoute } from './me.js'
import { userHooks, users } from './resource.js'

// What the users module adds to the service: the resource's routes, and GET /auth/me.

const resource = resourceModule(users, {
  access: { list: { who: 'admin' }, create: { who: 'admin', signup: true } },
  hooks: userHooks,
  summaries: {
    replace: 'Replace a user\'s name and e-mail (role and password only when given)',
    delete: 'Delete a user, its sessions and its API keys',
  },
})

export const userModule = { ...resource, routes: [...resource.routes, meRoute] }
