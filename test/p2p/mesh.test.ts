import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {DIAL_DEFER_MS} from '../../src/core/p2p/dialer.js'
import {waitFor} from '../helpers.js'
import {startNodes, stopAll} from './helpers.js'

describe('the full mesh of a run', () => {
  it('every pair of clients that learn of each other at once ends with one connection, not two', async () => {
    const nodes = await startNodes(6, {relay: false})
    try {
      const all = nodes.flatMap((n) => n.node.addresses())
      // As a state push does: everyone is told about everyone at the same moment.
      await Promise.all(nodes.map((n) => n.node.connect(all)))
      await waitFor(() => nodes.every((n) => n.node.libp2p.getConnections().length >= 5), 10_000, 'the mesh')
      await new Promise((r) => setTimeout(r, DIAL_DEFER_MS + 300))
      for (const n of nodes) {
        const peers = n.node.libp2p.getConnections().map((c) => c.remotePeer.toString())
        assert.equal(new Set(peers).size, 5, 'connected to every other node')
        assert.equal(peers.length, 5, `${peers.length} connections for 5 peers`)
      }
    } finally {
      await stopAll(nodes)
    }
  })

  it('a client that is told of a peer which does not dial it dials it itself after the wait', async () => {
    const [a, b] = await startNodes(2, {relay: false})
    try {
      // Only one side learns of the other, whichever id is lower.
      const started = Date.now()
      await a.node.connect(b.node.addresses())
      assert.equal(a.node.libp2p.getConnections().filter((c) => c.remotePeer.toString() === b.node.peerId).length, 1)
      assert.ok(Date.now() - started < DIAL_DEFER_MS + 5_000)
    } finally {
      await stopAll([a, b])
    }
  })
})
