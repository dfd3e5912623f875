import Type from 'typebox'
import { idMember, nameSchema, timestampMember } from '../core/resources/common.js'
import { member } from '../core/resources/member.js'
import { defineResource } from '../core/resources/resource.js'

// ISO 4217 codes in current use, as the ICU data shipped with Node knows them:
// "XYZ" has the right shape but is no currency.
const currencies: ReadonlySet<string> = new Set(Intl.supportedValuesOf('currency'))
const isCurrency = (value: string) => currencies.has(value)

export const products = defineResource({
  name: 'Product',
  path: '/products',
  table: 'products',
  // Anyone signed in reads the catalogue; admins keep it.
  access: { read: 'any', write: 'admin' },
  // A deleted product waits in the trash for TRASH_RETENTION, restorable.
  trash: true,
  formats: { iso4217: isCurrency },
  members: {
    id: idMember(),
    sku: member(
      Type.String({
        pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$',
        description: 'a SKU of 1 to 64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit',
      }),
      {
        sort: true,
        search: true,
        unique: { constraint: 'products_sku_key', code: 'sku_taken', title: 'SKU already in use' },
      },
    ),
    name: member(nameSchema(), { sort: true, search: true }),
    description: member(
      Type.String({
        maxLength: 10000,
        // Multi-line text: tab, line feed and carriage return are allowed, other control characters are not.
        pattern: '^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f]*$',
        description: 'a text of at most 10000 characters without control characters other than tab and line breaks',
      }),
      { search: true, default: '', nullable: true },
    ),
    price: member(
      Type.Integer({
        minimum: 0,
        maximum: 1_000_000_000_000,
        description: 'the price in the minor unit of the currency',
      }),
      { sort: true },
    ),
    currency: member(
      Type.String({ format: 'iso4217', description: 'an ISO 4217 currency code in upper case, such as EUR' }),
      { sort: true },
    ),
    stock: member(Type.Integer({ minimum: 0, maximum: 2_147_483_647 }), { sort: true, default: 0, nullable: true }),
    created_at: timestampMember(),
    updated_at: timestampMember(),
  },
})
