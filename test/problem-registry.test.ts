import assert from 'node:assert/strict'
import { test } from 'node:test'
import Type from 'typebox'
import { applicationProblems } from '../src/app-problems.js'
import { coreProblems, HttpError, problemBody, registerProblems } from '../src/core/http/problem.js'
import { registerFormats } from '../src/core/resources/formats.js'
import { defineResource } from '../src/core/resources/resource.js'
import { member } from '../src/core/resources/member.js'
import { idMember } from '../src/core/resources/common.js'
import { products } from '../src/products/resource.js'
import { buildRegistry } from '../src/registry.js'
import { resourceModule } from '../src/resource-module.js'
import { applicationResources } from '../src/resources.js'
import { applicationRegistry } from './helpers/registry.js'

// Problem codes are an open registry: core's, the application's and each
// resource's unique codes, each bound to one status and title.

test('a registered code answers with its status and title; an unregistered one is a programming error', () => {
  registerProblems({ test_teapot: { status: 418, title: 'A teapot' } })
  const err = new HttpError('test_teapot', 'Short and stout.')
  assert.equal(err.status, 418)
  assert.equal(problemBody(err, '/x', 'r-1').title, 'A teapot')
  assert.throws(() => new HttpError('never_registered', 'x'), /problem code "never_registered" is not registered/)
})

test('registering a code again is a no-op with the same meaning and throws with another status or title', () => {
  registerProblems({ test_again: { status: 409, title: 'Again' } })
  registerProblems({ test_again: { status: 409, title: 'Again' } })
  assert.throws(() => registerProblems({ test_again: { status: 410, title: 'Again' } }), /registered as 409 "Again", not 410 "Again"/)
  assert.throws(() => registerProblems({ test_again: { status: 409, title: 'Other' } }), /not 409 "Other"/)
  assert.throws(() => registerProblems({ 'Bad Code': { status: 400, title: 'x' } }), /lower case/)
})

test("the service's codes are core's, the application's and each declaration's unique codes, each 409 with its declared title", () => {
  const { problems } = applicationRegistry
  for (const code of [...Object.keys(coreProblems), ...Object.keys(applicationProblems)]) assert.ok(problems[code], code)
  for (const resource of applicationRegistry.resources) {
    for (const { code } of resource.uniqueCodes.values()) assert.deepEqual(problems[code], resource.problems[code])
  }
  const [sku] = products.uniqueCodes.values()
  assert.equal(problems[sku!.code]!.status, 409)
})

test('a declaration whose unique code clashes with a registered code of another meaning fails when the registry is built', () => {
  const clash = defineResource({
    name: 'Clash', path: '/clashes', table: 'clashes', access: { read: 'any', write: 'admin' },
    members: { id: idMember(), label: member(Type.String(), { unique: { constraint: 'clashes_label_key', code: 'not_found', title: 'Taken' } }) },
  })
  assert.throws(() => buildRegistry([...applicationResources, resourceModule(clash)]), /problem code "not_found" is registered as 404/)
})

test('a string format is registered by the declaration that uses it, before its validators are compiled; again with another check throws', () => {
  const check = (v: string) => v === 'ok'
  const declared = defineResource({
    name: 'Formatted', path: '/formatted', table: 'formatted', access: { read: 'any', write: 'admin' },
    formats: { test_format: check },
    members: { code: member(Type.String({ format: 'test_format' })) },
  })
  assert.deepEqual(declared.bodies.create.errors({ code: 'ok' }), [])
  assert.equal(declared.bodies.create.errors({ code: 'no' }).length, 1)
  registerFormats({ test_format: check })
  assert.throws(() => registerFormats({ test_format: (v) => v === 'other' }), /registered already with another check/)
})
