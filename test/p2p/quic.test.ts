import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {resultCommitment, type ResultAnnouncement} from '../../src/core/p2p/index.js'
import {withQuicListen} from '../../src/core/p2p/transports.js'
import {waitFor} from '../helpers.js'
import {meshUp, randomBlob, startNodes, stopAll, type TestNode} from './helpers.js'

describe('p2p: QUIC beside TCP', () => {
  let nodes: TestNode[] = []
  let tcpOnly: TestNode[] = []
  before(async () => {
    nodes = await startNodes(2, {quic: true})
    tcpOnly = await startNodes(1, {quic: false})
  })
  after(async () => stopAll([...nodes, ...tcpOnly]))

  it('listens on a QUIC address beside each TCP one', () => {
    assert.deepEqual(withQuicListen(['/ip4/0.0.0.0/tcp/4001']), ['/ip4/0.0.0.0/tcp/4001', '/ip4/0.0.0.0/udp/4001/quic-v1'])
    assert.deepEqual(withQuicListen(['/ip4/1.2.3.4/udp/9/quic-v1', '/ip4/1.2.3.4/tcp/9']), ['/ip4/1.2.3.4/udp/9/quic-v1', '/ip4/1.2.3.4/tcp/9'])
    for (const n of nodes) {
      const addrs = n.node.addresses()
      assert.ok(
        addrs.some((a) => /^\/ip4\/127\.0\.0\.1\/udp\/\d+\/quic-v1\/p2p\//.test(a)),
        `a QUIC address announced: ${addrs.join(' ')}`,
      )
      assert.ok(
        addrs.some((a) => /^\/ip4\/127\.0\.0\.1\/tcp\/\d+\/p2p\//.test(a)),
        `a TCP address announced: ${addrs.join(' ')}`,
      )
    }
    assert.ok(
      tcpOnly[0].node.addresses().every((a) => !a.includes('quic')),
      'quic: false announces TCP only',
    )
  })

  it('two nodes with both connect over QUIC and exchange a result', async () => {
    await meshUp(nodes)
    for (const [i, n] of nodes.entries()) {
      const other = nodes[1 - i].node.peerId
      const conns = n.node.libp2p.getConnections().filter((c) => c.remotePeer.toString() === other && c.status === 'open')
      assert.ok(conns.length > 0)
      for (const c of conns) assert.match(c.remoteAddr.toString(), /\/udp\/\d+\/quic-v1/, 'the direct connection is QUIC, not TCP')
    }
    const got: ResultAnnouncement[] = []
    nodes[1].node.onAnnouncement((a) => got.push(a))
    const blob = randomBlob(1_200_000)
    const published = await nodes[0].node.publishResult(3, 0, 4, blob)
    await waitFor(() => got.length > 0, 10_000, 'the announcement over QUIC')
    assert.equal(got[0].commitment, published.commitment)
    const bytes = await nodes[1].node.fetchResult(got[0])
    assert.equal(resultCommitment(bytes), resultCommitment(blob))
    assert.equal(nodes[1].node.stats().bytesReceived, blob.length)
  })

  it('a node with QUIC reaches a TCP-only node over TCP', async () => {
    const [a] = nodes
    await a.node.connect(tcpOnly[0].node.addresses())
    await waitFor(() => a.node.libp2p.getConnections().some((c) => c.remotePeer.toString() === tcpOnly[0].node.peerId && c.status === 'open'), 10_000, 'a TCP connection')
    const conns = a.node.libp2p.getConnections().filter((c) => c.remotePeer.toString() === tcpOnly[0].node.peerId)
    assert.ok(conns.every((c) => /\/tcp\/\d+/.test(c.remoteAddr.toString())))
  })

  it('falls back to TCP when the QUIC address does not answer (UDP blocked)', async () => {
    const [, b] = nodes
    const target = tcpOnly[0].node
    // A QUIC address of the TCP-only peer where nothing listens (its UDP is "blocked"), listed before its TCP one.
    const dead = `/ip4/127.0.0.1/udp/9/quic-v1/p2p/${target.peerId}`
    const started = Date.now()
    await b.node.connect([dead, ...target.addresses()])
    const conns = b.node.libp2p.getConnections().filter((c) => c.remotePeer.toString() === target.peerId && c.status === 'open')
    assert.ok(conns.length > 0, 'connected')
    assert.ok(
      conns.every((c) => /\/tcp\/\d+/.test(c.remoteAddr.toString())),
      'over TCP',
    )
    assert.ok(Date.now() - started < 6_000, `the QUIC attempt gave up quickly (${Date.now() - started} ms)`)
  })
})
