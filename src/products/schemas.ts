import Type, { type Static } from 'typebox'
import Format from 'typebox/format'
import { NameSchema, readOnlyEcho } from '../resources/common.js'

// ISO 4217 codes in current use, as the ICU data shipped with Node knows them:
// "XYZ" has the right shape but is no currency.
const currencies = new Set(Intl.supportedValuesOf('currency'))
Format.Set('iso4217', (value) => currencies.has(value))

const Sku = Type.String({
  pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$',
  description: 'a SKU of 1 to 64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit',
})
const Description = Type.String({
  maxLength: 10000,
  // Multi-line text: tab, line feed and carriage return are allowed, other control characters are not.
  pattern: '^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f]*$',
  description: 'a text of at most 10000 characters without control characters other than tab and line breaks',
})
const Price = Type.Integer({ minimum: 0, maximum: 1_000_000_000_000, description: 'the price in the minor unit of the currency' })
const Currency = Type.String({ format: 'iso4217', description: 'an ISO 4217 currency code in upper case, such as EUR' })
const Stock = Type.Integer({ minimum: 0, maximum: 2_147_483_647 })

export const productDefaults = { description: '', stock: 0 }

export const ProductCreate = Type.Object(
  { sku: Sku, name: NameSchema, description: Type.Optional(Description), price: Price, currency: Currency, stock: Type.Optional(Stock) },
  { additionalProperties: false },
)
export type ProductCreate = Static<typeof ProductCreate>

/** PUT replaces every writable member; description and stock left out get their defaults. */
export const ProductReplace = Type.Object({ ...ProductCreate.properties, ...readOnlyEcho }, { additionalProperties: false })
export type ProductReplace = Static<typeof ProductReplace>

/** PATCH (RFC 7396): `null` resets description or stock to its default; on a required member it is a 422. */
export const ProductPatch = Type.Object(
  {
    sku: Type.Optional(Sku),
    name: Type.Optional(NameSchema),
    description: Type.Optional(Type.Union([Description, Type.Null()])),
    price: Type.Optional(Price),
    currency: Type.Optional(Currency),
    stock: Type.Optional(Type.Union([Stock, Type.Null()])),
    ...readOnlyEcho,
  },
  { additionalProperties: false },
)
export type ProductPatch = Static<typeof ProductPatch>

/** A product as the API returns it. */
export const Product = Type.Object({
  id: Type.Integer({ minimum: 1 }),
  sku: Type.String(),
  name: Type.String(),
  description: Type.String(),
  price: Type.Integer({ minimum: 0 }),
  currency: Type.String(),
  stock: Type.Integer({ minimum: 0 }),
  created_at: Type.String({ format: 'date-time' }),
  updated_at: Type.String({ format: 'date-time' }),
}, { additionalProperties: false })
/** A page of a list: `fields` may leave members out. */
export const ProductPage = Type.Array(Type.Partial(Product))
