import assert from 'node:assert/strict'
import { test } from 'node:test'
import Type from 'typebox'
import { HttpError } from '../src/core/http/problem.js'
import { compileValidator } from '../src/core/http/validate.js'

// The one validation mechanism: a value the schema refuses is never accepted,
// even when TypeBox's report has no words for why.

const twelve = Array.from({ length: 12 }, (_, i) => Type.Literal(`type.${i}`))
const validator = compileValidator(
  Type.Object(
    {
      kinds: Type.Array(Type.Union(twelve)),
      one: Type.Optional(Type.Union(twelve)),
    },
    { additionalProperties: false },
  ),
)

test('a union of more literals than TypeBox reports errors for still refuses a value outside it, at its path', () => {
  const errors = validator.errors({ kinds: ['type.1', 'type.exploded'] })
  assert.equal(errors.length, 1)
  assert.equal(errors[0]!.path, '/kinds/1')
  assert.throws(
    () => validator.parseBody({ kinds: ['type.exploded'] }),
    (err: unknown) => err instanceof HttpError && err.code === 'validation_failed',
  )
  assert.equal(validator.errors({ kinds: [], one: 'nope' })[0]!.path, '/one')
})

test('values inside the union pass', () => {
  assert.deepEqual(validator.errors({ kinds: ['type.0', 'type.11'], one: 'type.5' }), [])
})
