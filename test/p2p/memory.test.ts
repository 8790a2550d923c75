import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {randomUUID} from 'node:crypto'
import {after, before, describe, it} from 'node:test'
import {memory} from '@libp2p/memory'
import {P2PNode, ResultStore, resultCommitment, signAnnouncement, type ResultAnnouncement} from '../../src/core/p2p/index.js'
import {waitFor} from '../helpers.js'
import {randomBlob, testIdentity, type TestNode} from './helpers.js'

// The P2P services over an in-memory transport (transports are injected): no socket, no port, no address filtering.
async function startMemoryNode(): Promise<TestNode> {
  const identity = testIdentity()
  const events: EventLine[] = []
  const store = new ResultStore()
  const node = await P2PNode.start({
    identity,
    runId: 'memory-run',
    relay: false,
    transports: [memory()],
    listen: [`/memory/${randomUUID()}`],
    resultStore: store,
    log: (e) => events.push(e),
  })
  return {node, identity, events, store}
}

describe('p2p services over a memory transport', () => {
  let nodes: TestNode[] = []
  before(async () => {
    nodes = [await startMemoryNode(), await startMemoryNode(), await startMemoryNode()]
    for (const n of nodes) await n.node.connect(nodes.filter((m) => m !== n).flatMap((m) => m.node.allAddresses()))
    await waitFor(() => nodes.every((n) => n.node.topicPeers() === nodes.length - 1), 10_000, 'topic subscriptions over the memory transport')
  })
  after(async () => Promise.all(nodes.map((n) => n.node.stop())))

  it('listens and connects on /memory addresses only', () => {
    for (const n of nodes) {
      assert.ok(n.node.allAddresses().length > 0)
      assert.ok(
        n.node.allAddresses().every((a) => a.startsWith('/memory/')),
        n.node.allAddresses().join(' '),
      )
      assert.deepEqual(n.node.connectionKinds(), {direct: nodes.length - 1, relayed: 0})
    }
  })

  it('gossips an announcement and transfers its blob; the fetcher re-serves it and counts the bytes per peer', async () => {
    const [producer, fetcher, third] = nodes
    const seen: ResultAnnouncement[] = []
    fetcher.node.onAnnouncement((a) => seen.push(a))
    const blob = randomBlob(300_000)
    const published = await producer.node.publishResult(4, 0, 2, blob)
    await waitFor(() => seen.length === 1, 10_000, 'the announcement')
    assert.deepEqual(seen[0], published)
    const bytes = await fetcher.node.fetchResult(seen[0])
    assert.equal(resultCommitment(bytes), resultCommitment(blob))
    assert.equal(fetcher.node.stats().bytesReceived, blob.length)
    assert.deepEqual(fetcher.node.stats().peerBytes[producer.identity.id], {in: blob.length, out: 0})
    assert.equal(fetcher.store.get(published.commitment)?.length, blob.length, 'kept in the injected store')
    // The third node gets it from whichever holder answers first, and both the producer and the fetcher hold it.
    await producer.node.stop()
    const again = await third.node.fetchResult(published)
    assert.equal(resultCommitment(again), published.commitment)
    assert.equal(fetcher.node.stats().bytesSent, blob.length, 'the fetcher re-served the blob to the third node')
  })

  it('a store holding the wrong bytes makes its node a dishonest holder: the fetcher discards them and names it', async () => {
    const [, liar, fetcher] = nodes
    const real = randomBlob(4_000)
    const commitment = resultCommitment(real)
    liar.store.put(commitment, 9, randomBlob(real.length))
    const a = signAnnouncement(liar.identity, {run_id: 'memory-run', step: 9, client_id: liar.identity.id, batch_start: 0, batch_end: 1, commitment, size: real.length})
    await assert.rejects(fetcher.node.fetchResult(a), /bytes do not match the commitment/)
    const bad = fetcher.events.filter((e) => e.event === 'bad_blob')
    assert.deepEqual(
      bad.map((e) => e.from),
      [liar.node.peerId],
    )
    assert.equal(fetcher.node.hasResult(commitment), false)
  })
})
