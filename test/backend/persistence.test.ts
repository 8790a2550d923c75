import assert from 'node:assert/strict'
import {mkdirSync, readFileSync, readdirSync, rmdirSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {SAVED_IDENTITY_FILE, SAVED_STATE_FILE, serverIdentity, StateStore} from '../../src/core/backend/centralized/persistence.js'
import {emptyLedger} from '../../src/core/coordinator/rewards.js'
import {serializeState} from '../../src/core/coordinator/index.js'
import type {EventLine} from '../../src/core/events.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {tempDir} from '../helpers.js'
import {joinAll, newRun} from '../coordinator/helpers.js'

const [A, B] = ['a1', 'b2'].map((c) => c.repeat(32))

describe('persistence: the saved state and the server identity', () => {
  it('a saved state loads back as it was: the state, the directory, the ledger', () => {
    const dir = tempDir()
    try {
      const store = new StateStore(dir.path, () => {})
      assert.equal(store.load('test-run'), undefined, 'nothing saved yet')
      const state = joinAll(newRun(), [A, B], 0)
      assert.equal(store.save({state, peers: {[A]: ['/ip4/1.2.3.4/tcp/1']}, rewards: emptyLedger()}), true)
      assert.deepEqual(readdirSync(dir.path), [SAVED_STATE_FILE], 'written under a temporary name, then renamed')
      const loaded = store.load('test-run')!
      assert.equal(serializeState(loaded.state), serializeState(state))
      assert.deepEqual(loaded.peers, {[A]: ['/ip4/1.2.3.4/tcp/1']})
      assert.deepEqual(loaded.rewards, emptyLedger())
    } finally {
      dir.cleanup()
    }
  })

  it('a file of another run, another kind or garbage is refused naming the file (ESAVEDSTATE); a directory entry that is not a list of strings is left out', () => {
    const dir = tempDir()
    try {
      const store = new StateStore(dir.path, () => {})
      store.save({state: newRun(), peers: {}, rewards: emptyLedger()})
      assert.throws(
        () => store.load('other-run'),
        (e: Error & {code?: string}) => e.code === 'ESAVEDSTATE' && e.message.includes(store.path) && /it is run "test-run"/.test(e.message),
      )
      const saved = JSON.parse(readFileSync(store.path, 'utf8'))
      writeFileSync(store.path, JSON.stringify({...saved, peers: {[A]: ['/ip4/1.2.3.4/tcp/1'], [B]: [7]}}))
      assert.deepEqual(store.load('test-run')!.peers, {[A]: ['/ip4/1.2.3.4/tcp/1']})
      writeFileSync(store.path, JSON.stringify({...saved, version: 2}))
      assert.throws(() => store.load('test-run'), /not a psyche coordinator state file/)
      writeFileSync(store.path, '{')
      assert.throws(() => store.load('test-run'), /cannot read/)
    } finally {
      dir.cleanup()
    }
  })

  it('a failed save is logged with the file and the failures in a row, counted, and returned as false; the next good save resets the count', () => {
    const dir = tempDir()
    try {
      const logs: EventLine[] = []
      // The file's name is taken by a directory: the rename onto it fails.
      mkdirSync(join(dir.path, SAVED_STATE_FILE))
      const store = new StateStore(dir.path, (e) => logs.push(e))
      assert.equal(store.save({state: newRun(), peers: {}, rewards: emptyLedger()}, 100), false)
      assert.equal(store.save({state: newRun(), peers: {}, rewards: emptyLedger()}, 101), false)
      assert.equal(logs.length, 2)
      assert.deepEqual({...logs[1], message: undefined}, {event: 'error', where: 'save', path: store.path, message: undefined, failures_in_a_row: 2, last_saved_step: null})
      const failing = store.health()
      assert.deepEqual(
        {...failing, last_error: undefined},
        {path: store.path, ok: false, failures_in_a_row: 2, failures: 2, last_error: undefined, last_saved_step: null, last_saved_at: null},
      )
      assert.match(failing.last_error!, /EISDIR|EEXIST|ENOTEMPTY|directory/i)
      // The disk is fixed: the next save succeeds and the count in a row starts again (the total stays).
      const version = store.version
      rmdirSync(join(dir.path, SAVED_STATE_FILE))
      assert.equal(store.save({state: newRun(), peers: {}, rewards: emptyLedger()}, 102), true)
      assert.deepEqual(store.health(), {
        path: store.path,
        ok: true,
        failures_in_a_row: 0,
        failures: 2,
        last_error: null,
        last_saved_step: newRun().progress.step,
        last_saved_at: 102,
      })
      assert.ok(store.version > version, 'watchers are told')
    } finally {
      dir.cleanup()
    }
  })

  it('the directory is created with the store, whatever gave the identity; one that cannot be created is an error naming it', () => {
    const dir = tempDir()
    try {
      const nested = join(dir.path, 'a', 'b')
      new StateStore(nested, () => {})
      assert.deepEqual(readdirSync(nested), [])
      writeFileSync(join(dir.path, 'file'), 'x')
      assert.throws(
        () => new StateStore(join(dir.path, 'file', 'sub'), () => {}),
        (e: Error & {code?: string}) => e.code === 'ESAVEDSTATE' && e.message.includes(join(dir.path, 'file', 'sub')),
      )
    } finally {
      dir.cleanup()
    }
  })

  it('the identity: the given one, else the one kept in the directory (created there once), else a new one', async () => {
    const dir = tempDir()
    try {
      const given = generateIdentity()
      assert.equal(await serverIdentity(dir.path, given), given)
      const kept = join(dir.path, 'state')
      const first = await serverIdentity(kept)
      assert.deepEqual(readdirSync(kept), [SAVED_IDENTITY_FILE])
      assert.equal((await serverIdentity(kept)).id, first.id)
      assert.notEqual((await serverIdentity(undefined)).id, first.id)
    } finally {
      dir.cleanup()
    }
  })
})
