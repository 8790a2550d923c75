import assert from 'node:assert/strict'
import {mkdirSync, readFileSync, readdirSync, writeFileSync} from 'node:fs'
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

  it('a failed save is logged with the file and returned as false', () => {
    const dir = tempDir()
    try {
      const logs: EventLine[] = []
      // The file's name is taken by a directory: the rename onto it fails.
      mkdirSync(join(dir.path, SAVED_STATE_FILE))
      const store = new StateStore(dir.path, (e) => logs.push(e))
      assert.equal(store.save({state: newRun(), peers: {}, rewards: emptyLedger()}), false)
      assert.equal(logs.length, 1)
      assert.deepEqual({...logs[0], message: undefined}, {event: 'error', where: 'save', path: store.path, message: undefined})
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
