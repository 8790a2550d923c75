import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {waitFor} from '../helpers.js'
import {meshUp, randomBlob, startNodes, stopAll} from './helpers.js'

describe('the full mesh of a run', () => {
  it('clients sharing one address are not scored down for it (gossipsub would graylist them past 10 and drop their subscriptions)', async () => {
    // With the default (weight −5, threshold 10), 16 clients on one host saw 0–7 of their 15 peers subscribed and no
    // announcement spread (bench/README.md, "Scale"); a NAT or the run's relay puts many clients on one address too.
    const [a] = await startNodes(1, {relay: false})
    try {
      const pubsub = a.node.libp2p.services.pubsub as unknown as {score: {params: {IPColocationFactorWeight: number}}}
      assert.equal(pubsub.score.params.IPColocationFactorWeight, 0)
    } finally {
      await stopAll([a])
    }
  })

  it('gossip (IHAVE) goes to a fixed number of peers per heartbeat, not a share of them (ids per client per round grew as N²)', async () => {
    const nodes = await startNodes(12, {relay: false, wireMetrics: true})
    try {
      const opts = (nodes[0].node.libp2p.services.pubsub as unknown as {opts: {Dlazy: number; gossipFactor: number}}).opts
      assert.deepEqual([opts.Dlazy, opts.gossipFactor], [3, 0])
      await meshUp(nodes)
      let delivered = 0
      for (const n of nodes) n.node.onAnnouncement(() => delivered++)
      await Promise.all(nodes.map((n, i) => n.node.publishResult(1, i, i + 1, randomBlob(64))))
      await waitFor(() => delivered === 12 * 11, 10_000, 'every announcement delivered everywhere')
      // An id is gossiped in the 3 heartbeats (1 s each) after it arrived: wait them out.
      await new Promise((r) => setTimeout(r, 4_500))
      for (const n of nodes) {
        const g = n.node.wireCounts()!.gossipsub
        // Dlazy peers in each of ≤ 4 heartbeats whose window holds these ids (gossipsub's default: 6 of the 11 − D
        // peers outside the mesh each time).
        assert.ok((g.rpc_sent_ihave ?? 0) <= 3 * 4, `IHAVE sent to ${g.rpc_sent_ihave} peers`)
        assert.equal(g.msg_publish_count, 1)
      }
    } finally {
      await stopAll(nodes)
    }
  })

  for (const quic of [false, true])
    it(`a pair whose lower peer's dial the higher refuses (libp2p's inbound connections a second per host) still connects: each side dials once more${quic ? ' (QUIC)' : ''}`, async () => {
      // One inbound connection a second per host: a third node's dial spends the higher peer's second, so the lower
      // peer's dial is refused while the lower one refuses the higher one's (the tie rule). Before, over QUIC both
      // dials had resolved (the refusal comes after the handshake) and neither side dialled again.
      const nodes = await startNodes(3, {relay: false, quic, connectionManager: {inboundConnectionThreshold: 1}})
      try {
        const [low, mid, high] = [...nodes].sort((a, b) => (a.node.peerId < b.node.peerId ? -1 : 1))
        await mid.node.connect(high.node.addresses())
        await Promise.all([low.node.connect(high.node.addresses()), high.node.connect(low.node.addresses())])
        // A connection that stays: a refused one closes within a few ms of opening.
        const lasting = () => low.node.libp2p.getConnections(high.node.libp2p.peerId).filter((c) => c.status === 'open' && Date.now() - c.timeline.open > 1_000)
        await waitFor(() => lasting().length > 0, 8_000, 'the lower and the higher peer connected for a second')
        assert.equal(lasting().length, 1)
        for (const n of [low, high])
          assert.deepEqual(
            n.events.filter((e) => e.event === 'dial_failed'),
            [],
          )
      } finally {
        await stopAll(nodes)
      }
    })

  for (const quic of [false, true])
    it(`peers that dial each other at once keep one connection per pair (the lower peer id dialled it), and gossip flows over it${quic ? ' (QUIC: every connection QUIC)' : ''}`, async () => {
      const nodes = await startNodes(6, {relay: false, quic})
      try {
        const addrs = nodes.flatMap((n) => n.node.addresses())
        // As one state push telling everyone of everyone: every node dials every other at the same time, twice.
        await Promise.all(nodes.map((n) => n.node.connect(addrs)))
        await Promise.all(nodes.map((n) => n.node.connect(addrs)))
        await waitFor(() => nodes.every((n) => n.node.topicPeers() === 5), 15_000, 'every node subscribed everywhere')
        for (const n of nodes) {
          const connections = n.node.libp2p.getConnections().filter((c) => c.status === 'open')
          assert.equal(connections.length, 5, `${n.node.peerId}: ${connections.map((c) => `${c.direction} ${c.remotePeer}`).join(', ')}`)
          for (const c of connections) assert.equal(c.direction, n.node.peerId < c.remotePeer.toString() ? 'outbound' : 'inbound')
          // Direct, and over QUIC when both have it (dialled first), TCP otherwise.
          for (const c of connections) assert.match(c.remoteAddr.toString(), quic ? /^\/ip4\/127\.0\.0\.1\/udp\/\d+\/quic-v1/ : /^\/ip4\/127\.0\.0\.1\/tcp\/\d+/)
        }
        assert.ok(
          nodes.every((n) => n.node.unreachablePeers().length === 0 && !n.events.some((e) => e.event === 'dial_failed')),
          'no dial reported failed',
        )
        let delivered = 0
        for (const n of nodes) n.node.onAnnouncement(() => delivered++)
        await Promise.all(nodes.map((n, i) => n.node.publishResult(1, i, i + 1, randomBlob(64))))
        await waitFor(() => delivered === 6 * 5, 10_000, 'every announcement delivered everywhere')
      } finally {
        await stopAll(nodes)
      }
    })
})
