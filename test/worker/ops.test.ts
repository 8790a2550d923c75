import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {WORKER_OPS} from '../../src/core/worker/ops.js'
import {projectRoot} from '../../src/core/worker/python.js'

/** python/psyche_worker/ops.json: the table the worker serves from (python/tests/test_ops_table.py checks that side). */
const table = JSON.parse(readFileSync(join(projectRoot, 'python', 'psyche_worker', 'ops.json'), 'utf8')) as {
  ops: Record<string, string>
  errors: Record<string, {doc: string; fields?: Record<string, string>}>
}

describe('worker ops: one table for both sides', () => {
  it("the client's op names are exactly the table's", () => {
    assert.equal(new Set(WORKER_OPS).size, WORKER_OPS.length, 'an op listed twice')
    assert.deepEqual([...WORKER_OPS].sort(), Object.keys(table.ops).sort())
  })

  it('the error fields the client reads are the ones the table gives their kind', () => {
    // WorkerRequestError.index (src/core/worker/client.ts) is read from a bad_result reply
    assert.ok(table.errors.bad_result?.fields?.index, 'bad_result carries index')
    for (const [kind, spec] of Object.entries(table.errors)) {
      assert.match(kind, /^[a-z_]+$/)
      assert.ok(spec.doc, `error kind ${kind} has a doc`)
      for (const field of Object.keys(spec.fields ?? {})) assert.ok(!['kind', 'message'].includes(field), `${kind}.${field} is reserved`)
    }
  })
})
