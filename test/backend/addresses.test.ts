import assert from 'node:assert/strict'
import {test} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {generateIdentity} from '../../src/core/protocol/index.js'
import {tempDir} from '../helpers.js'
import {RUN_ID, startTestServer, waitUntil, writeRunConfig} from './helpers.js'

test('the welcome tells each client the relay as it reached the server; an addresses message updates the peer directory every client sees', async () => {
  const dir = tempDir()
  const asked: (string | undefined)[] = []
  const t = await startTestServer(writeRunConfig(dir.path), {
    relayAddrs: (local) => {
      asked.push(local)
      return [`/ip4/${local}/tcp/4001/p2p/12D3KooWRelay`]
    },
  })
  const alice = generateIdentity()
  const bob = generateIdentity()
  const a = await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity: alice, p2pAddrs: ['/ip4/10.0.0.2/tcp/1/p2p/A'], join: true})
  const b = await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity: bob, p2pAddrs: ['/ip4/10.0.0.3/tcp/1/p2p/B'], join: true})
  try {
    assert.deepEqual(asked, ['127.0.0.1', '127.0.0.1'])
    assert.deepEqual(a.relayAddrs, ['/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWRelay'])
    await waitUntil(() => b.peers[alice.id], 'alice in the directory')
    const relayed = ['/ip4/10.0.0.2/tcp/1/p2p/A', '/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWRelay/p2p-circuit/p2p/A']
    assert.ok(a.sendAddresses(relayed))
    await waitUntil(() => b.peers[alice.id]?.length === 2, "alice's relayed address to reach bob")
    assert.deepEqual(b.peers[alice.id], relayed)
    assert.deepEqual(t.server.peers[alice.id], relayed)
    await t.waitLog({event: 'addresses', client: alice.id})
    // A reconnect's hello carries the latest addresses too.
    a.sendAddresses(['/ip4/10.0.0.9/tcp/1/p2p/A'])
    await waitUntil(() => b.peers[alice.id]?.[0] === '/ip4/10.0.0.9/tcp/1/p2p/A', 'the second update')
  } finally {
    await a.close()
    await b.close()
    await t.server.stop()
    dir.cleanup()
  }
})

test('without a relay the welcome names none', async () => {
  const dir = tempDir()
  const t = await startTestServer(writeRunConfig(dir.path))
  const a = await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity: generateIdentity(), p2pAddrs: [], join: true})
  try {
    assert.deepEqual(a.relayAddrs, [])
  } finally {
    await a.close()
    await t.server.stop()
    dir.cleanup()
  }
})
