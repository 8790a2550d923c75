import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {after, describe, it} from 'node:test'
import {RESULT_PROTOCOL, resultCommitment} from '../../src/core/p2p/index.js'
import {meshUp, randomBlob, startNodes, stopAll, type TestNode} from './helpers.js'

async function startNode(options: {maxBlobBytes?: number; maxConcurrentDownloads?: number} = {}): Promise<TestNode> {
  const [node] = await startNodes(1, {runId: 'limits-run', ...options})
  return node
}

describe('p2p: size and concurrency bounds', () => {
  const nodes: TestNode[] = []
  after(async () => stopAll(nodes))

  it('refuses an announced blob larger than maxBlobBytes without downloading it, and will not publish one', async () => {
    const producer = await startNode({maxBlobBytes: 8 << 20})
    const small = await startNode({maxBlobBytes: 1 << 20})
    nodes.push(producer, small)
    await meshUp([producer, small])
    const a = await producer.node.publishResult(1, 0, 1, randomBlob(2 << 20))
    await assert.rejects(small.node.fetchResult(a), /is 2097152 bytes, more than the 1048576-byte maximum/)
    assert.equal(small.node.stats().bytesReceived, 0)
    assert.equal(producer.node.stats().bytesSent, 0)
    assert.ok(small.events.some((e) => e.event === 'blob_refused' && e.client_id === producer.identity.id))
    await assert.rejects(small.node.publishResult(1, 0, 1, randomBlob((1 << 20) + 1)), /more than the 1048576-byte maximum blob size/)
  })

  it('keeps at most maxConcurrentDownloads fetches in flight, and large multi-chunk blobs arrive intact', async () => {
    const producer = await startNode()
    const fetcher = await startNode({maxConcurrentDownloads: 2})
    nodes.push(producer, fetcher)
    await meshUp([producer, fetcher])
    const blobs = Array.from({length: 6}, (_, i) => randomBlob((i === 0 ? 20 : 2) << 20))
    const announcements = await Promise.all(blobs.map((b, i) => producer.node.publishResult(2, i, i + 1, b)))
    // Counted independently of the node's own bookkeeping: open result streams on the fetcher's connections.
    const openResultStreams = () =>
      fetcher.node.libp2p
        .getConnections()
        .flatMap((c) => c.streams)
        .filter((s) => s.protocol === RESULT_PROTOCOL && s.direction === 'outbound').length
    let observedMax = 0
    const sampler = setInterval(() => (observedMax = Math.max(observedMax, openResultStreams())), 2)
    const fetched = await Promise.all(announcements.map((a) => fetcher.node.fetchResult(a)))
    clearInterval(sampler)
    fetched.forEach((bytes, i) => assert.equal(resultCommitment(bytes), resultCommitment(blobs[i])))
    assert.equal(fetcher.node.stats().peakDownloadsInFlight, 2, 'the bound was reached and never exceeded')
    assert.ok(observedMax >= 1 && observedMax <= 2, `observed ${observedMax} open result streams`)
    assert.equal(fetcher.node.stats().downloadsInFlight, 0)
    assert.equal(
      fetcher.node.stats().bytesReceived,
      blobs.reduce((s, b) => s + b.length, 0),
    )
  })

  it('concurrent fetches of one result share a single download', async () => {
    const [producer, fetcher] = nodes.slice(-2)
    const blob = randomBlob(3 << 20)
    const a = await producer.node.publishResult(3, 0, 1, blob)
    const before = fetcher.node.stats().bytesReceived
    const [x, y, z] = await Promise.all([fetcher.node.fetchResult(a), fetcher.node.fetchResult(a), fetcher.node.fetchResult({...a})])
    assert.equal(resultCommitment(x), a.commitment)
    assert.ok(x === y && y === z)
    assert.equal(fetcher.node.stats().bytesReceived - before, blob.length)
  })

  it('connect skips itself and logs unreachable or malformed addresses without throwing', async () => {
    const n = await startNode()
    nodes.push(n)
    await n.node.connect([...n.node.addresses(), 'not-a-multiaddr', '/ip4/127.0.0.1/tcp/1/p2p/' + (await startNodePeerId())])
    const failed = n.events.filter((e) => e.event === 'dial_failed')
    assert.equal(failed.length, 2, JSON.stringify(failed))
    assert.match(String(failed.find((e) => e.addr === 'not-a-multiaddr')?.reason), /not a multiaddr/)
    assert.equal(n.node.stats().peers, 0)
  })
})

/** The peer id of a node that is no longer listening (so dialing it fails). */
async function startNodePeerId(): Promise<string> {
  const gone = await startNode()
  await gone.node.stop()
  return gone.node.peerId
}
