import assert from 'node:assert/strict'
import { test } from 'node:test'
import Type from 'typebox'
import Format from 'typebox/format'
import { coreProblems, HttpError, problemAnswer, problemTable } from '../src/core/http/problem.js'
import { defineResource } from '../src/core/resources/resource.js'
import { member } from '../src/core/resources/member.js'
import { idMember } from '../src/core/resources/common.js'
import { products } from '../src/products/resource.js'
import { buildRegistry } from '../src/registry.js'
import { resourceModule } from '../src/resource-module.js'
import { applicationModules } from '../src/modules.js'
import { applicationRegistry } from './helpers/registry.js'

// Problem codes are an open registry: core's, the application's and each
// resource's unique codes, each bound to one status and title.

test(
  'a code answers with the status and title of the table it is answered by; a code the table lacks answers ' + '500',
  () => {
    const table = problemTable(coreProblems, { test_teapot: { status: 418, title: 'A teapot' } })
    const answer = problemAnswer(
      new HttpError('test_teapot', 'Short and stout.', { headers: { 'x-kind': 'teapot' } }),
      table,
      '/x',
      'r-1',
    )
    assert.equal(answer.status, 418)
    assert.equal(answer.unknown, false)
    assert.deepEqual(answer.headers, { 'x-kind': 'teapot' })
    assert.deepEqual(answer.body, {
      type: 'tag:users-products-api,2026:test_teapot',
      title: 'A teapot',
      status: 418,
      code: 'test_teapot',
      detail: 'Short and stout.',
      instance: '/x',
      request_id: 'r-1',
    })
    const unknown = problemAnswer(new HttpError('never_registered', 'x'), table, '/x', 'r-2')
    assert.equal(unknown.status, 500)
    assert.equal(unknown.unknown, true, 'said to the caller, which logs it')
    assert.equal(unknown.body.code, 'internal_error')
    assert.doesNotMatch(JSON.stringify(unknown.body), /never_registered/)
  },
)

test('a code in two sources must mean the same thing: the same status and title join, another throws', () => {
  const again = { test_again: { status: 409, title: 'Again' } }
  assert.deepEqual(problemTable(again, again), again)
  assert.throws(
    () => problemTable(again, { test_again: { status: 410, title: 'Again' } }),
    /registered as 409 "Again", not 410 "Again"/,
  )
  assert.throws(() => problemTable(again, { test_again: { status: 409, title: 'Other' } }), /not 409 "Other"/)
  assert.throws(() => problemTable({ 'Bad Code': { status: 400, title: 'x' } }), /lower case/)
})

test(
  "two registries in one process keep their own codes: one resource's unique code is not the other " + "service's",
  () => {
    const gadgets = defineResource({
      name: 'Gadget',
      path: '/gadgets',
      table: 'gadgets',
      access: { read: 'any', write: 'admin' },
      members: {
        id: idMember(),
        label: member(Type.String(), {
          unique: { constraint: 'gadgets_label_key', code: 'gadget_label_taken', title: 'Label taken' },
        }),
      },
    })
    const withGadgets = buildRegistry([
      ...applicationModules,
      { name: 'gadgets', resources: [resourceModule(gadgets)] },
    ])
    assert.equal(withGadgets.problems.gadget_label_taken?.status, 409)
    assert.equal(applicationRegistry.problems.gadget_label_taken, undefined)
    assert.equal(
      buildRegistry(applicationModules).problems.gadget_label_taken,
      undefined,
      'building one registry changes no other',
    )
    const taken = new HttpError('gadget_label_taken', 'Taken.')
    assert.equal(problemAnswer(taken, withGadgets.problems, '/gadgets', 'r').status, 409)
    assert.equal(problemAnswer(taken, applicationRegistry.problems, '/gadgets', 'r').status, 500)
  },
)

test(
  "the service's codes are core's, the application's and each declaration's unique codes, each 409 with its " +
    'declared title',
  () => {
    const { problems } = applicationRegistry
    for (const code of [
      ...Object.keys(coreProblems),
      ...applicationModules.flatMap((m) => Object.keys(m.problems ?? {})),
    ])
      assert.ok(problems[code], code)
    for (const resource of applicationRegistry.resources) {
      for (const { code } of resource.uniqueCodes.values()) assert.deepEqual(problems[code], resource.problems[code])
    }
    const [sku] = products.uniqueCodes.values()
    assert.equal(problems[sku!.code]!.status, 409)
  },
)

test(
  'a declaration whose unique code clashes with a registered code of another meaning fails when the registry is ' +
    'built',
  () => {
    const clash = defineResource({
      name: 'Clash',
      path: '/clashes',
      table: 'clashes',
      access: { read: 'any', write: 'admin' },
      members: {
        id: idMember(),
        label: member(Type.String(), {
          unique: { constraint: 'clashes_label_key', code: 'not_found', title: 'Taken' },
        }),
      },
    })
    assert.throws(
      () => buildRegistry([...applicationModules, { name: 'clash', resources: [resourceModule(clash)] }]),
      /problem code "not_found" is registered as 404/,
    )
  },
)

test(
  'a string format means what its own declaration says: two declarations may give one name two checks; an ' +
    'undeclared one fails at definition',
  () => {
    const declare = (name: string, check: (v: string) => boolean) =>
      defineResource({
        name,
        path: `/${name.toLowerCase()}`,
        table: name.toLowerCase(),
        access: { read: 'any', write: 'admin' },
        formats: { test_format: check },
        members: { code: member(Type.String({ format: 'test_format' })) },
      })
    const ok = declare('Formatted', (v) => v === 'ok')
    const other = declare('Reformatted', (v) => v === 'other')
    assert.deepEqual(ok.bodies.create.errors({ code: 'ok' }), [])
    assert.deepEqual(
      ok.bodies.create.errors({ code: 'other' }).map((e) => e.path),
      ['/code'],
    )
    assert.deepEqual(other.bodies.create.errors({ code: 'other' }), [])
    assert.deepEqual(
      other.bodies.create.errors({ code: 'ok' }).map((e) => e.path),
      ['/code'],
    )
    // The process's table is left as TypeBox made it: nothing of either declaration stays in it.
    assert.equal(Format.Has('test_format'), false)
    assert.equal(Format.Get('date-time'), Format.IsDateTime)
    assert.throws(
      () =>
        defineResource({
          name: 'Unformatted',
          path: '/unformatted',
          table: 'unformatted',
          access: { read: 'any', write: 'admin' },
          members: { code: member(Type.String({ format: 'test_undeclared' })) },
        }),
      /string format "test_undeclared" has no check/,
    )
  },
)

test(
  "every date-time of the API is the API's own (years 0001 to 9999, which PostgreSQL and JavaScript both hold), " +
    "not TypeBox's",
  () => {
    const declared = defineResource({
      name: 'Dated',
      path: '/dated',
      table: 'dated',
      access: { read: 'any', write: 'admin' },
      members: { at: member(Type.String({ format: 'date-time' })) },
    })
    assert.deepEqual(declared.bodies.create.errors({ at: '2026-11-27T21:00:00Z' }), [])
    assert.equal(Format.Test('date-time', '0000-01-01T00:00:00Z'), true, "TypeBox's date-time takes the year 0")
    assert.deepEqual(
      declared.bodies.create.errors({ at: '0000-01-01T00:00:00Z' }).map((e) => e.path),
      ['/at'],
    )
  },
)
