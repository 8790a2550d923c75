import assert from 'node:assert/strict'
import {EventEmitter} from 'node:events'
import {describe, test} from 'node:test'
import {nonSnakeKeys, snakeCase, snakeKeys} from '../../src/core/cli/json.js'
import {SIGNAL_EXIT_CODE, Shutdown} from '../../src/core/cli/signals.js'
import {waitFor} from '../helpers.js'

describe('--json keys are snake_case', () => {
  test('snakeCase turns camelCase names into snake_case and leaves snake_case alone', () => {
    assert.equal(snakeCase('tokensPerSecond'), 'tokens_per_second')
    assert.equal(snakeCase('firstValLoss'), 'first_val_loss')
    assert.equal(snakeCase('bytesIn'), 'bytes_in')
    assert.equal(snakeCase('sha256Hex'), 'sha256_hex')
    assert.equal(snakeCase('param_hash'), 'param_hash')
    assert.equal(snakeCase('steps'), 'steps')
  })

  test('snakeKeys renames plain objects recursively, arrays included, and leaves values alone', () => {
    const out = snakeKeys({lastStep: 3, paramHash: 'ab', distro: {resultBytes: 10, denseBytes: 40}, files: [{sizeBytes: 1, name: 'modelA'}], when: null})
    assert.deepEqual(out, {last_step: 3, param_hash: 'ab', distro: {result_bytes: 10, dense_bytes: 40}, files: [{size_bytes: 1, name: 'modelA'}], when: null})
    const buf = Buffer.from([1])
    assert.equal(snakeKeys({rawBytes: buf}).raw_bytes, buf, 'a non-plain object is passed through, not copied')
  })

  test('nonSnakeKeys names every camelCase key with its path, and accepts lower-case data keys', () => {
    assert.deepEqual(nonSnakeKeys({a_b: 1, c: {dE: 2, list: [{fG: 1}]}, 'client-0': {ok: 1}, ['ab'.repeat(32)]: 1}), ['c.dE', 'c.list[0].fG'])
    assert.deepEqual(nonSnakeKeys(snakeKeys({lastStep: 1, nested: {bytesOut: [1, {aB: 2}]}})), [])
  })
})

describe('signals: one place (cli/signals.ts)', () => {
  function setup(graceMs = 10_000) {
    const target = new EventEmitter()
    const exits: number[] = []
    const shutdown = new Shutdown({graceMs, target: target as unknown as NodeJS.Process, exit: (code) => void exits.push(code)})
    shutdown.install()
    return {target, exits, shutdown}
  }

  test('a command that does not ask for an orderly stop exits at once with 128 + the signal number', () => {
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
      const {target, exits, shutdown} = setup()
      target.emit(signal)
      assert.deepEqual(exits, [SIGNAL_EXIT_CODE[signal]])
      assert.equal(shutdown.exitCode, SIGNAL_EXIT_CODE[signal])
      shutdown.dispose()
    }
    assert.deepEqual(SIGNAL_EXIT_CODE, {SIGINT: 130, SIGTERM: 143, SIGHUP: 129})
  })

  test('requested(): the command is told, stops in order, and is not exited under it; a second signal exits', async () => {
    const {target, exits, shutdown} = setup()
    const asked = shutdown.requested()
    target.emit('SIGTERM')
    assert.equal(await asked, 'SIGTERM')
    assert.deepEqual(exits, [], 'no exit while the command stops in order')
    assert.equal(await shutdown.requested(), 'SIGTERM', 'asking after the signal resolves at once')
    target.emit('SIGINT')
    assert.deepEqual(exits, [143], 'the second signal exits with the first one’s code')
    shutdown.dispose()
  })

  test('onSignal(fn): fn runs (e.g. withdraw from the run), then the process exits with the signal’s code', async () => {
    const {target, exits, shutdown} = setup()
    const calls: string[] = []
    shutdown.onSignal(async (signal) => {
      await new Promise((r) => setTimeout(r, 20))
      calls.push(signal)
    })
    target.emit('SIGINT')
    assert.deepEqual(exits, [], 'not before fn has finished')
    await waitFor(() => exits.length > 0, 5000, 'the exit')
    assert.deepEqual(calls, ['SIGINT'], 'fn finished before the exit')
    assert.deepEqual(exits, [130])
    shutdown.dispose()
  })

  test('an orderly stop that takes longer than the grace period is cut short', async () => {
    const {target, exits, shutdown} = setup(30)
    void shutdown.requested()
    const started = Date.now()
    target.emit('SIGTERM')
    await waitFor(() => exits.length > 0, 5000, 'the exit')
    assert.deepEqual(exits, [143])
    assert.ok(Date.now() - started >= 25, 'not before the grace period') // the stop itself never ends
    shutdown.dispose()
  })

  test('dispose() removes every listener it installed', () => {
    const {target, shutdown} = setup()
    assert.equal(target.listenerCount('SIGINT') + target.listenerCount('SIGTERM') + target.listenerCount('SIGHUP'), 3)
    shutdown.dispose()
    assert.equal(target.listenerCount('SIGINT') + target.listenerCount('SIGTERM') + target.listenerCount('SIGHUP'), 0)
  })
})
