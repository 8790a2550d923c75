import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {P2PNode, peerIdOfClient, resultCommitment, type ResultAnnouncement} from '../../src/core/p2p/index.js'
import {ANNOUNCE_PROTOCOL} from '../../src/core/p2p/result-exchange.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import {waitFor} from '../helpers.js'
import {meshUp, randomBlob, startNodes, stopAll, type TestNode} from './helpers.js'

describe('p2p: result gossip and blob transfer between three real libp2p nodes', () => {
  let nodes: TestNode[] = []
  let late: TestNode[] = []
  const received: ResultAnnouncement[][] = [[], [], []]
  let published: ResultAnnouncement[] = []
  before(async () => {
    nodes = await startNodes(3, {wireMetrics: true})
    await meshUp(nodes)
  })
  after(async () => stopAll([...nodes, ...late]))

  it('peer ids derive from the client identities (no directory needed)', () => {
    for (const n of nodes) assert.equal(n.node.peerId, peerIdOfClient(n.identity.id).toString())
    for (const n of nodes) assert.ok(n.node.addresses().every((a) => a.startsWith('/ip4/127.0.0.1/tcp/') && a.endsWith(`/p2p/${n.node.peerId}`)))
  })

  it("every node receives the others' announcements and fetches their blobs", async () => {
    nodes.forEach((n, i) => n.node.onAnnouncement((a) => received[i].push(a)))
    const blobs = nodes.map((_, i) => randomBlob(200_000 + i * 1_500_000))
    published = await Promise.all(nodes.map((n, i) => n.node.publishResult(7, i * 4, i * 4 + 4, blobs[i])))
    published.forEach((a, i) => {
      assert.equal(a.client_id, nodes[i].identity.id)
      assert.equal(a.commitment, resultCommitment(blobs[i]))
      assert.equal(a.size, blobs[i].length)
    })
    await waitFor(() => received.every((r) => r.length >= 2), 10_000, 'announcements to arrive')
    for (const [i, r] of received.entries()) {
      assert.equal(r.length, 2, 'own announcement is not delivered, the other two are, once each')
      assert.deepEqual(
        r.map((a) => a.client_id).sort(),
        nodes
          .filter((_, j) => j !== i)
          .map((n) => n.identity.id)
          .sort(),
      )
      for (const a of r) {
        const bytes = await nodes[i].node.fetchResult(a)
        const producer = nodes.findIndex((n) => n.identity.id === a.client_id)
        assert.deepEqual(Buffer.from(bytes), Buffer.from(blobs[producer]))
        assert.ok(nodes[i].node.hasResult(a.commitment))
      }
    }
    const total = blobs.reduce((s, b) => s + b.length, 0)
    const sent = nodes.reduce((s, n) => s + n.node.stats().bytesSent, 0)
    const got = nodes.reduce((s, n) => s + n.node.stats().bytesReceived, 0)
    assert.equal(got, 2 * total, 'each blob downloaded by the two other nodes')
    assert.equal(sent, got)
    for (const n of nodes) assert.equal(n.node.stats().peers, 2)
    for (const n of nodes) assert.equal(n.node.stats().badBlobs, 0)
    // The 200 kB result (under --swarm-min-bytes) came in one request; the 1.7 MB and 3.2 MB ones in 1 MiB pieces,
    // each checked on arrival: 2 and 4 of them per fetcher.
    for (const [i, n] of nodes.entries()) {
      const pieces = new Map(n.events.flatMap((e) => (e.event === 'result_fetched' && e.step === 7 ? [[e.client_id, e.pieces] as const] : [])))
      for (const [j, m] of nodes.entries()) {
        if (j === i) continue
        const got = pieces.get(m.identity.id)
        assert.equal(got === undefined ? undefined : got.reduce((a, b) => a + b.pieces, 0), [undefined, 2, 4][j])
      }
      assert.equal(n.node.stats().piecesFetched, [6, 4, 2][i])
      assert.equal(n.node.stats().badPieces, 0)
      // A piece session the fetcher closed once it had what it wanted is no failure of the holder's.
      assert.deepEqual(
        n.events.filter((e) => e.event === 'serve_failed'),
        [],
      )
    }
    // The wire counters (wireMetrics) see every result byte on its protocol's streams, and more on the connections.
    for (const [i, n] of nodes.entries()) {
      const wire = n.node.wireCounts()!
      const others = total - blobs[i].length
      assert.ok(wire.protocols['/psyche/result/1'].in >= others && wire.protocols['/psyche/result/1'].in < others + 4096, JSON.stringify(wire.protocols))
      assert.ok(wire.connections.in > wire.protocols['/psyche/result/1'].in)
      assert.ok(wire.gossipsub.rpc_recv_message >= 2)
    }
    // Bytes per peer, keyed by client id: node i downloaded each other blob once, from its producer or from a node
    // that told it it held it (have.ts: a later fetcher asks an earlier one), and what was served was received.
    let outs = 0
    for (const [i, n] of nodes.entries()) {
      const perPeer = n.node.stats().peerBytes
      const others = new Set(nodes.filter((_, j) => j !== i).map((m) => m.identity.id))
      assert.ok(Object.keys(perPeer).length > 0 && Object.keys(perPeer).every((k) => others.has(k)), JSON.stringify(Object.keys(perPeer)))
      assert.equal(
        Object.values(perPeer).reduce((acc, p) => acc + p.in, 0),
        total - blobs[i].length,
      )
      outs += Object.values(perPeer).reduce((acc, p) => acc + p.out, 0)
    }
    assert.equal(outs, 2 * total)
  })

  it('a late joiner gets a re-announced result (sent to it alone) and fetches it from a re-serving peer once the producer is gone; peers that saw it do not deliver it twice', async () => {
    late = await startNodes(1, {wireMetrics: true})
    const [joiner] = late
    const got: ResultAnnouncement[] = []
    joiner.node.onAnnouncement((a) => got.push(a))
    await joiner.node.connect(nodes.flatMap((n) => n.node.addresses()))
    await waitFor(() => nodes[0].node.topicPeers() === 3 && joiner.node.topicPeers() === 3, 10_000, 'the joiner to subscribe')
    // The re-announcement goes to the joiner over its own stream (/psyche/announce/1), so it does not wait for
    // gossipsub's outbound stream to the joiner. The joiner may also get the others' recent announcements through
    // gossip (IHAVE/IWANT of the last heartbeats' messages): each is delivered once.
    await nodes[0].node.reannounce(published[0])
    const sentBefore = nodes[1].node.stats().bytesSent + nodes[2].node.stats().bytesSent
    await waitFor(() => got.some((a) => a.signature === published[0].signature), 10_000, 're-announcement')
    await new Promise((r) => setTimeout(r, 300))
    assert.deepEqual(
      got.filter((a) => a.signature === published[0].signature),
      [published[0]],
    )
    assert.ok(
      got.every((a) => published.some((p) => p.signature === a.signature)) && new Set(got.map((a) => a.signature)).size === got.length,
      'anything else delivered is an earlier announcement, once',
    )
    // Sent to the joiner over /psyche/announce/1, not gossiped to everyone again.
    assert.ok((joiner.node.wireCounts()!.protocols[ANNOUNCE_PROTOCOL]?.in ?? 0) > 0, 'the joiner received it directly')
    for (const n of nodes.slice(1)) assert.equal(n.node.wireCounts()!.protocols[ANNOUNCE_PROTOCOL], undefined, 'no re-announcement to peers that had it')
    assert.equal(nodes[0].node.wireCounts()!.gossipsub.msg_publish_count, 1, 'published once, not again')
    // A second call sends nothing: every subscriber has had it.
    const sentTo = nodes[0].node.wireCounts()!.protocols[ANNOUNCE_PROTOCOL]
    assert.ok((sentTo?.out ?? 0) > 0)
    await nodes[0].node.reannounce(published[0])
    assert.deepEqual(nodes[0].node.wireCounts()!.protocols[ANNOUNCE_PROTOCOL], sentTo)
    // With the producer gone, a node that downloaded the result serves it.
    await nodes[0].node.stop()
    // got[0] may be an earlier announcement the joiner had through gossip: fetch the re-announced one.
    const bytes = await joiner.node.fetchResult(got.find((a) => a.signature === published[0].signature)!)
    assert.equal(resultCommitment(bytes), published[0].commitment)
    // The producer, gone and not connected, is not dialled while connected peers may hold it (PRODUCER_DIAL_GRACE_MS).
    assert.ok(!joiner.events.some((e) => e.event === 'fetch_failed' && e.from === nodes[0].node.peerId), 'the gone producer was not dialled')
    assert.equal(nodes[1].node.stats().bytesSent + nodes[2].node.stats().bytesSent - sentBefore, published[0].size)
    await new Promise((r) => setTimeout(r, 300))
    assert.equal(received[1].length, 2)
    assert.equal(received[2].length, 2)
  })
})

describe('p2p: a restarted client keeps its peer id', () => {
  it('derives the same libp2p key from the same identity seed', async () => {
    const seed = new Uint8Array(32).fill(7)
    const first = await P2PNode.start({identity: identityFromSeed(seed), runId: 'r', listen: ['/ip4/127.0.0.1/tcp/0']})
    const firstId = first.peerId
    await first.stop()
    const again = await P2PNode.start({identity: identityFromSeed(seed), runId: 'r', listen: ['/ip4/127.0.0.1/tcp/0']})
    try {
      assert.equal(again.peerId, firstId)
      assert.equal(again.peerId, peerIdOfClient(identityFromSeed(seed).id).toString())
    } finally {
      await again.stop()
    }
  })
})
