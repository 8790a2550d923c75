import assert from 'node:assert/strict'
import net from 'node:net'
import {randomBytes} from 'node:crypto'
import {after, before, describe, it} from 'node:test'
import {parsePunchAddr} from '../../src/core/p2p/punch.js'
import {punchTcp} from '../../src/core/p2p/punch-socket.js'
import {RelayNode} from '../../src/core/p2p/relay.js'
import {freePort, waitFor} from '../helpers.js'
import {randomBlob, startNodes, stopAll, testIdentity, type TestNode} from './helpers.js'

describe('hole punching: the addresses a peer may give (pure)', () => {
  it('takes a remote unicast /ip4 or /ip6 TCP endpoint and nothing else', () => {
    assert.deepEqual(parsePunchAddr('/ip4/45.77.0.3/tcp/40001'), {host: '45.77.0.3', port: 40001})
    assert.deepEqual(parsePunchAddr('/ip6/2001:db8::1/tcp/5'), {host: '2001:db8::1', port: 5})
    for (const bad of [
      undefined,
      7,
      '/ip4/127.0.0.1/tcp/4001',
      '/ip4/0.0.0.0/tcp/4001',
      '/ip4/169.254.1.1/tcp/4001',
      '/ip4/224.0.0.1/tcp/4001',
      '/ip6/ff02::1/tcp/4001',
      '/ip4/45.77.0.3/tcp/0',
      '/ip4/45.77.0.3/udp/4001',
      '/ip4/45.77.0.3/tcp/4001/p2p/12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo',
      '/dns4/example.org/tcp/1',
      '/ip4/45.77.0.3',
      'x'.repeat(200),
      'not a multiaddr',
    ]) {
      assert.throws(() => parsePunchAddr(bad), Error, String(bad))
    }
  })

  it('loopback only when our own mapping is on loopback (one machine)', () => {
    assert.deepEqual(parsePunchAddr('/ip4/127.0.0.1/tcp/4001', {loopback: true}), {host: '127.0.0.1', port: 4001})
  })

  it('fuzz: random strings never crash it, and what it takes is a real endpoint', () => {
    const pieces = ['/ip4/', '45.77.0.3', '/tcp/', '4001', '/ip6/', '::1', '/p2p-circuit', '/udp/', '65536', '-1', '/', 'ż', '\u0000']
    for (let i = 0; i < 2000; i++) {
      const n = randomBytes(1)[0] % 6
      const value = Array.from({length: n}, () => pieces[randomBytes(1)[0] % pieces.length]).join('')
      try {
        const e = parsePunchAddr(value)
        assert.ok(e.port >= 1 && e.port <= 65535 && net.isIP(e.host) !== 0, value)
      } catch (error) {
        assert.ok(error instanceof Error)
      }
    }
  })
})

describe('hole punching: the dial window', () => {
  it('gives up after its window when nobody answers, with a bounded number of dials', async () => {
    const mine = await freePort()
    let theirs = await freePort()
    while (theirs === mine) theirs = await freePort()
    const started = Date.now()
    const r = await punchTcp('127.0.0.1', theirs, mine, {windowMs: 300, retryMs: 20})
    assert.equal(r.socket, undefined)
    assert.equal(r.lastError, 'ECONNREFUSED')
    assert.ok(Date.now() - started < 1_000)
    assert.ok(r.attempts >= 2 && r.attempts <= 300 / 20 + 1, String(r.attempts))
  })
})

// On one machine a SYN to a port nobody listens on is refused at once, so two dials never cross (the namespace
// test, test/net/punch.test.ts, punches through real NAT routers): what is checked here is the protocol over the
// relayed connection, the mapping each side learns from the relay, the bounded failure, and the relay fallback.
for (const quic of [false, true])
  describe(`hole punching: two relayed peers try, fail on loopback, and keep the relay${quic ? " (reached over QUIC: the punch still learns the relay's TCP address)" : ''}`, () => {
    let relay: RelayNode
    let a: TestNode
    let b: TestNode
    before(async () => {
      relay = await RelayNode.start({identity: testIdentity(), listen: ['/ip4/127.0.0.1/tcp/0']})
      // Each listens on an address other than the one it reaches the relay from, so the relay's dial-back cannot
      // check it: both reserve a slot, as two clients behind NATs.
      // WebRTC off: on one machine it would connect the pair at once (test/p2p/webrtc.test.ts); TCP punching is checked here.
      ;[a] = await startNodes(1, {listen: ['/ip4/127.0.0.2/tcp/0'], punchWindowMs: 400, quic, webrtc: false})
      ;[b] = await startNodes(1, {listen: ['/ip4/127.0.0.3/tcp/0'], punchWindowMs: 400, quic, webrtc: false})
    })
    after(async () => {
      await stopAll([a, b].filter(Boolean))
      await relay?.stop()
    })

    it('both sides log the failed punch with the addresses the relay saw them at; results still arrive through the relay', async () => {
      for (const n of [a, b]) await n.node.useRelays(relay.addressFor('127.0.0.1'))
      await waitFor(() => a.node.relayedAddresses().length > 0 && b.node.relayedAddresses().length > 0, 10_000, 'relay reservations')
      // With QUIC the clients reach the relay over it, so their relayed connection runs over QUIC.
      for (const n of [a, b])
        assert.ok(
          n.node.libp2p.getConnections().some((c) => c.remotePeer.toString() === relay.peerId && c.remoteAddr.toString().includes('/quic-v1') === quic),
          n.node.libp2p
            .getConnections()
            .map((c) => c.remoteAddr.toString())
            .join(' '),
        )
      await a.node.connect(b.node.addresses().filter((x) => x.includes('/p2p-circuit/')))
      const failed = (n: TestNode) => n.events.filter((e) => e.event === 'hole_punch_failed')
      await waitFor(() => failed(a).length > 0 && failed(b).length > 0, 10_000, 'hole_punch_failed on both sides')
      const [fa, fb] = [failed(a)[0], failed(b)[0]]
      assert.ok(fa.event === 'hole_punch_failed' && fb.event === 'hole_punch_failed')
      assert.deepEqual([fa.role, fb.role].sort(), ['initiator', 'responder'])
      for (const e of [fa, fb]) {
        // Each dialled the other's port as the relay saw it (127.0.0.1:<punch port>), within its window.
        assert.match(e.reason, /no dial from :\d+ \(seen as \/ip4\/127\.0\.0\.1\/tcp\/\d+\) to \/ip4\/127\.0\.0\.1\/tcp\/\d+ got through in 400 ms/, e.reason)
        assert.ok(e.attempts >= 1 && e.ms < 10_000, JSON.stringify(e))
      }
      assert.equal(a.node.onlyRelayed(b.node.libp2p.peerId), true)
      await waitFor(() => a.node.topicPeers() >= 1 && b.node.topicPeers() >= 1, 10_000, 'topic subscriptions')
      const relayedBefore = a.node.stats().relayedReceived
      const blob = randomBlob(100_000)
      const got = new Promise<Uint8Array>((resolve, reject) => a.node.onAnnouncement((x) => void a.node.fetchResult(x).then(resolve, reject)))
      await b.node.publishResult(1, 0, 1, blob)
      assert.deepEqual(await got, blob)
      assert.ok(a.node.stats().relayedReceived - relayedBefore >= blob.length, 'the result came through the relay')
    })
  })
