import Type from 'typebox'
import { idMember, nameSchema, timestampMember } from '../../src/core/resources/common.js'
import { member } from '../../src/core/resources/member.js'
import { defineResource } from '../../src/core/resources/resource.js'
import { resourceRoutes } from '../../src/core/resources/routes.js'

// A resource that exists only in tests: what adding a resource takes, whole.
// Its declaration and its migration are all there is; the routes, bodies,
// collection, ETags, idempotency and OpenAPI come from the one mechanism.

export const widgets = defineResource({
  name: 'Widget',
  path: '/widgets',
  table: 'widgets',
  members: {
    id: idMember(),
    label: member(nameSchema(), { sort: true, search: true }),
    size: member(Type.Integer({ minimum: 1, maximum: 2_000_000_000 }), { sort: true }),
    colour: member(Type.Union([Type.Literal('red'), Type.Literal('green'), Type.Literal('blue')]), { sort: true, default: 'red', nullable: true }),
    created_at: timestampMember(),
    updated_at: timestampMember(),
  },
})

export const widgetRoutes = resourceRoutes(widgets, {
  routes: {
    list: { access: { kind: 'protected', scope: null, who: 'any' } },
    read: { access: { kind: 'protected', scope: null, who: 'any' } },
    create: { access: { kind: 'protected', scope: null, who: 'admin' } },
    write: { access: { kind: 'protected', scope: null, who: 'admin' } },
  },
})

export const widgetsMigration = `
  CREATE TABLE widgets (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    label      text NOT NULL CHECK (char_length(label) BETWEEN 1 AND 200),
    size       integer NOT NULL CHECK (size BETWEEN 1 AND 2000000000),
    colour     text NOT NULL DEFAULT 'red' CHECK (colour IN ('red', 'green', 'blue')),
    version    integer NOT NULL DEFAULT 1,
    created_at timestamptz(3) NOT NULL DEFAULT now(),
    updated_at timestamptz(3) NOT NULL DEFAULT now()
  );
  CREATE INDEX widgets_label_id_idx ON widgets (label, id);
  CREATE INDEX widgets_size_id_idx ON widgets (size, id);
  CREATE INDEX widgets_colour_id_idx ON widgets (colour, id);
  CREATE INDEX widgets_created_at_id_idx ON widgets (created_at, id);
  CREATE INDEX widgets_updated_at_id_idx ON widgets (updated_at, id);
`
