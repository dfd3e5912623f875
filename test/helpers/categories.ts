import Type from 'typebox'
import { idMember, nameSchema, timestampMember } from '../../src/core/resources/common.js'
import { member } from '../../src/core/resources/member.js'
import { defineResource } from '../../src/core/resources/resource.js'
import { buildRegistry } from '../../src/registry.js'
import { resourceModule } from '../../src/resource-module.js'
import type { AppModule } from '../../src/app-module.js'
import { applicationModules } from '../../src/modules.js'

// A resource added the way docs/architecture.md says, and nothing more: its
// migration (sql/NNN_categories.sql in the application), its declaration
// file with its module (src/categories/resource.ts), and its line in src/modules.ts. Here
// the three are test-only: the migration runs on the test's own database, and
// the registry line is `categoriesRegistry`, handed to the test's service.

// --- sql/012_categories.sql
export const categoriesMigration = `
  CREATE TABLE categories (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
    description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 2000),
    version     integer NOT NULL DEFAULT 1,
    created_at  timestamptz(3) NOT NULL DEFAULT now(),
    updated_at  timestamptz(3) NOT NULL DEFAULT now(),
    deleted_at  timestamptz(3)
  );
  CREATE UNIQUE INDEX categories_name_key ON categories (name) WHERE deleted_at IS NULL;
  CREATE INDEX categories_deleted_at_idx ON categories (deleted_at) WHERE deleted_at IS NOT NULL;
  CREATE INDEX categories_name_id_idx ON categories (name, id);
  CREATE INDEX categories_created_at_id_idx ON categories (created_at, id);
  CREATE INDEX categories_updated_at_id_idx ON categories (updated_at, id);
`

// --- src/categories/resource.ts
export const categories = defineResource({
  name: 'Category',
  plural: 'Categories',
  path: '/categories',
  table: 'categories',
  access: { read: 'any', write: 'admin' },
  trash: true,
  members: {
    id: idMember(),
    name: member(nameSchema(), {
      sort: true,
      search: true,
      unique: { constraint: 'categories_name_key', code: 'category_name_taken', title: 'Category name already in use' },
    }),
    description: member(Type.String({ maxLength: 2000, pattern: '^[^\\u0000-\\u001f\\u007f]*$' }), {
      search: true,
      default: '',
      nullable: true,
    }),
    created_at: timestampMember(),
    updated_at: timestampMember(),
  },
})

export const categoriesModule: AppModule = { name: 'categories', resources: [resourceModule(categories)] }

// --- src/modules.ts: one line more in applicationModules
export const categoriesRegistry = buildRegistry([...applicationModules, categoriesModule])
