import assert from 'node:assert/strict'
import type {PsycheEvent} from '../../src/core/events.js'
import {randomBytes} from 'node:crypto'
import {after, before, describe, it} from 'node:test'
import {multiaddr} from '@multiformats/multiaddr'
import {dialbackTargets, hostOf, MAX_DIALBACK_ADDRS, parseDialbackResponse} from '../../src/core/p2p/dialback.js'
import {RelayNode} from '../../src/core/p2p/relay.js'
import {waitFor} from '../helpers.js'
import {randomBlob, startNodes, stopAll, testIdentity, type TestNode} from './helpers.js'

const ME = '12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo'
const OTHER = '12D3KooWRBy97UB99e3J6hiPesre1MZeuNQvfan4gBziswrRJsNK'

describe('dial-back: which addresses the relay dials (pure)', () => {
  it('dials only direct TCP and QUIC addresses on the IP the request came from, naming no peer or the requester', () => {
    const r = dialbackTargets(
      {
        addrs: [
          `/ip4/10.77.0.3/tcp/4001/p2p/${ME}`,
          '/ip4/10.77.0.3/tcp/4002',
          `/ip4/10.77.11.2/tcp/4001/p2p/${ME}`,
          `/ip4/10.77.0.3/tcp/4003/p2p/${OTHER}`,
          `/ip4/10.77.0.1/tcp/9/p2p/${OTHER}/p2p-circuit/p2p/${ME}`,
          '/ip4/10.77.0.3/udp/4001',
          'not a multiaddr',
          `/ip4/10.77.0.3/tcp/4001/p2p/${ME}`,
        ],
      },
      '10.77.0.3',
      ME,
    )
    assert.ok(r.ok)
    assert.deepEqual(
      r.targets.map((t) => t.toString()),
      [`/ip4/10.77.0.3/tcp/4001/p2p/${ME}`, `/ip4/10.77.0.3/tcp/4002/p2p/${ME}`],
    )
    assert.deepEqual(
      r.skipped.map((s) => s.reason),
      ['not on 10.77.0.3, where the request came from', 'names another peer', 'not a direct TCP or QUIC address', 'not a direct TCP or QUIC address', 'not a multiaddr'],
    )
    const q = dialbackTargets(
      {
        addrs: [
          `/ip4/10.77.0.3/udp/4001/quic-v1/p2p/${ME}`,
          '/ip4/10.77.0.3/udp/4002/quic-v1',
          `/ip4/10.77.11.2/udp/4001/quic-v1/p2p/${ME}`,
          `/ip4/10.77.0.3/udp/4003/quic-v1/p2p/${OTHER}`,
          `/ip4/10.77.0.1/udp/9/quic-v1/p2p/${OTHER}/p2p-circuit/p2p/${ME}`,
        ],
      },
      '10.77.0.3',
      ME,
    )
    assert.ok(q.ok)
    assert.deepEqual(
      q.targets.map((t) => t.toString()),
      [`/ip4/10.77.0.3/udp/4001/quic-v1/p2p/${ME}`, `/ip4/10.77.0.3/udp/4002/quic-v1/p2p/${ME}`],
    )
    assert.deepEqual(
      q.skipped.map((s) => s.reason),
      ['not on 10.77.0.3, where the request came from', 'names another peer', 'not a direct TCP or QUIC address'],
    )
  })

  it('a NATed client (its own address is not the one its connection comes from) gets nothing dialled', () => {
    const r = dialbackTargets({addrs: [`/ip4/10.77.11.2/tcp/4001/p2p/${ME}`]}, '10.77.0.4', ME)
    assert.ok(r.ok)
    assert.equal(r.targets.length, 0)
  })

  it('refuses malformed requests and requests over a relayed connection', () => {
    assert.equal(dialbackTargets({}, '10.0.0.1', ME).ok, false)
    assert.equal(dialbackTargets({addrs: 'x'}, '10.0.0.1', ME).ok, false)
    assert.equal(dialbackTargets({addrs: [1]}, '10.0.0.1', ME).ok, false)
    assert.equal(dialbackTargets({addrs: ['/ip4/10.0.0.1/tcp/1'.padEnd(600, '1')]}, '10.0.0.1', ME).ok, false)
    assert.equal(dialbackTargets({addrs: Array(MAX_DIALBACK_ADDRS + 1).fill('/ip4/10.0.0.1/tcp/1')}, '10.0.0.1', ME).ok, false)
    assert.equal(dialbackTargets({addrs: ['/ip4/10.0.0.1/tcp/1']}, undefined, ME).ok, false)
  })

  it('hostOf reads IPv4, IPv6 and IPv4-mapped IPv6 hosts', () => {
    assert.equal(hostOf(multiaddr('/ip4/10.1.2.3/tcp/1')), '10.1.2.3')
    assert.equal(hostOf(multiaddr('/ip6/2001:DB8::1/tcp/1')), '2001:db8::1')
    assert.equal(hostOf(multiaddr('/ip6/::ffff:10.1.2.3/tcp/1')), '10.1.2.3')
    assert.equal(hostOf(multiaddr('/dns4/example.org/tcp/1')), undefined)
  })

  it('the client keeps only its own addresses from the answer', () => {
    const asked = [`/ip4/10.77.0.3/tcp/4001/p2p/${ME}`]
    assert.deepEqual(parseDialbackResponse({reachable: [...asked, '/ip4/1.2.3.4/tcp/1', 7], checked: asked}, asked), {reachable: asked, checked: asked})
    assert.deepEqual(parseDialbackResponse({reachable: 'x'}, asked), {reachable: [], checked: []})
  })

  it('fuzz: random requests never throw', () => {
    const pieces = ['/ip4/10.0.0.1', '/tcp/4001', '/p2p/', ME, '/p2p-circuit', '/udp/1', '/quic-v1', '/ip6/::1', '/dns4/x', '/', 'ż', '\u0000']
    for (let i = 0; i < 2000; i++) {
      const n = randomBytes(1)[0] % 12
      const addrs: unknown[] = []
      for (let j = 0; j < n; j++) {
        const k = randomBytes(1)[0] % 6
        if (k === 0) addrs.push(randomBytes(randomBytes(1)[0]).toString('latin1'))
        else if (k === 1) addrs.push(randomBytes(1)[0])
        else addrs.push(Array.from({length: k + 1}, () => pieces[randomBytes(1)[0] % pieces.length]).join(''))
      }
      const request = randomBytes(1)[0] % 10 === 0 ? {addrs: 'nope'} : {addrs}
      const r = dialbackTargets(request, '10.0.0.1', ME)
      if (r.ok) assert.ok(r.targets.length <= MAX_DIALBACK_ADDRS)
      if (r.ok) for (const t of r.targets) assert.equal(hostOf(t), '10.0.0.1')
    }
  })
})

describe('relay: reserve a slot only when the dial-back fails', () => {
  let relay: RelayNode
  let reachable: TestNode
  let natted: TestNode
  const relayEvents: PsycheEvent[] = []
  before(async () => {
    relay = await RelayNode.start({identity: testIdentity(), listen: ['/ip4/127.0.0.1/tcp/0'], log: (e) => relayEvents.push(e)})
    // WebRTC off: on one machine it would replace their relayed connection with a direct one at once
    // (test/p2p/webrtc.test.ts); what the relay carries is checked here.
    ;[reachable] = await startNodes(1, {webrtc: false})
    // Listening on 127.0.0.2 but reaching the relay from 127.0.0.1: like a client behind NAT, its own address is
    // not the one its connection comes from, so the relay cannot check it.
    ;[natted] = await startNodes(1, {listen: ['/ip4/127.0.0.2/tcp/0'], webrtc: false})
  })
  after(async () => {
    await stopAll([reachable, natted].filter(Boolean))
    await relay?.stop()
  })

  it('a client the relay reaches directly reserves nothing; one it cannot check reserves and announces its relayed address', async () => {
    const relayAddr = relay.addressFor('127.0.0.1')
    await reachable.node.useRelays(relayAddr)
    assert.equal(reachable.node.reachability(), 'public')
    assert.ok(
      reachable.events.some((e) => e.event === 'reachability' && e.reachable === true),
      JSON.stringify(reachable.events),
    )
    assert.equal(reachable.node.relayedAddresses().length, 0)
    assert.equal(relay.reservations(), 0)

    await natted.node.useRelays(relayAddr)
    assert.equal(natted.node.reachability(), 'relayed')
    const verdict = natted.events.find((e) => e.event === 'reachability')
    assert.equal(verdict?.reachable, false, JSON.stringify(natted.events))
    await waitFor(() => natted.node.relayedAddresses().length > 0, 10_000, 'the relayed address')
    assert.equal(relay.reservations(), 1)
    await waitFor(() => relayEvents.some((e) => e.event === 'relay_reservation'), 5_000, 'the relay to log the reservation')
    assert.deepEqual(
      relayEvents.filter((e) => e.event === 'relay_reservation').map((e) => e.peer_id),
      [natted.node.peerId],
    )
    assert.deepEqual(
      relayEvents.filter((e) => e.event === 'dialback').map((e) => [e.peer_id, e.reachable.length]),
      [
        [reachable.node.peerId, 1],
        [natted.node.peerId, 0],
      ],
    )
    assert.ok(natted.node.addresses().some((a) => a.includes('/p2p-circuit/')))
  })

  it('downloads through the relay reuse the one relayed connection (libp2p would dial the relay again for each)', async () => {
    const relayed = natted.node.addresses().filter((a) => a.includes('/p2p-circuit/'))
    await reachable.node.connect(relayed)
    const peer = natted.node.libp2p.peerId
    await waitFor(() => reachable.node.libp2p.getConnections(peer).length > 0, 10_000, 'the relayed connection')
    assert.ok(reachable.node.onlyRelayed(peer))
    await waitFor(() => reachable.node.topicPeers() >= 1 && natted.node.topicPeers() >= 1, 10_000, 'topic subscriptions')
    for (let step = 1; step <= 5; step++) {
      const blob = randomBlob(200_000)
      const got = new Promise<void>((resolve, reject) =>
        reachable.node.onAnnouncement((a) => {
          if (a.step === step) reachable.node.fetchResult(a).then((b) => (assert.deepEqual(b, blob), resolve()), reject)
        }),
      )
      await natted.node.publishResult(step, 0, 1, blob)
      await got
    }
    assert.equal(reachable.node.libp2p.getConnections(peer).length, 1, 'one relayed connection for every download')
    assert.ok(reachable.node.onlyRelayed(peer))
  })
})

describe('relay over QUIC: the dial-back confirms QUIC addresses, and the bounds hold', () => {
  let relay: RelayNode
  let quicOnly: TestNode
  let natted: TestNode[] = []
  const relayEvents: PsycheEvent[] = []
  before(async () => {
    // One reservation: the second NATed client's request over QUIC must be refused.
    relay = await RelayNode.start({identity: testIdentity(), listen: ['/ip4/127.0.0.1/tcp/0'], limits: {maxReservations: 1}, log: (e) => relayEvents.push(e)})
    // Listening on QUIC only: reachable only if the relay dials its QUIC address back.
    ;[quicOnly] = await startNodes(1, {quic: true, listen: ['/ip4/127.0.0.1/udp/0/quic-v1']})
    natted = await startNodes(2, {quic: true, listen: ['/ip4/127.0.0.2/tcp/0'], webrtc: false})
  })
  after(async () => {
    await stopAll([quicOnly, ...natted].filter(Boolean))
    await relay?.stop()
  })

  it('listens on UDP beside TCP and tells clients both (QUIC first)', () => {
    assert.ok(relay.port > 0 && relay.quicPort > 0)
    assert.deepEqual(relay.addressFor('127.0.0.1'), [`/ip4/127.0.0.1/udp/${relay.quicPort}/quic-v1/p2p/${relay.peerId}`, `/ip4/127.0.0.1/tcp/${relay.port}/p2p/${relay.peerId}`])
    assert.ok(relay.addressFor(undefined).length === 0, 'loopback addresses are not offered as remote ones')
  })

  it('a client reachable only over QUIC is dialled back there, over QUIC, and its QUIC address is confirmed', async () => {
    await quicOnly.node.useRelays(relay.addressFor('127.0.0.1'))
    assert.equal(quicOnly.node.reachability(), 'public', JSON.stringify(quicOnly.events))
    const dialback = relayEvents.find((e) => e.event === 'dialback' && e.peer_id === quicOnly.node.peerId)
    assert.ok(dialback?.event === 'dialback' && dialback.reachable.length === 1 && dialback.reachable[0].includes('/quic-v1/'), JSON.stringify(dialback))
    const verdict = quicOnly.events.find((e) => e.event === 'reachability')
    assert.ok(verdict?.event === 'reachability' && verdict.reachable && verdict.addrs?.every((a) => a.includes('/udp/') && a.includes('/quic-v1/')), JSON.stringify(verdict))
    // It reached the relay over QUIC too (the relay's QUIC address is dialled first).
    const toRelay = quicOnly.node.libp2p.getConnections().filter((c) => c.remotePeer.toString() === relay.peerId && c.status === 'open')
    assert.ok(toRelay.length > 0 && toRelay.every((c) => c.remoteAddr.toString().includes('/quic-v1')), toRelay.map((c) => c.remoteAddr.toString()).join(' '))
    assert.equal(relay.reservations(), 0)
  })

  it('NATed clients reach the relay over QUIC; the reservation bound holds (one slot: the second is refused)', async () => {
    const relayAddr = relay.addressFor('127.0.0.1')
    await natted[0].node.useRelays(relayAddr)
    assert.equal(natted[0].node.reachability(), 'relayed', JSON.stringify(natted[0].events))
    await waitFor(() => natted[0].node.relayedAddresses().length > 0, 10_000, 'the relayed address')
    const conns = natted[0].node.libp2p.getConnections().filter((c) => c.remotePeer.toString() === relay.peerId && c.status === 'open')
    assert.ok(conns.length > 0 && conns.every((c) => c.remoteAddr.toString().includes('/quic-v1')), conns.map((c) => c.remoteAddr.toString()).join(' '))
    await natted[1].node.useRelays(relayAddr)
    assert.ok(
      natted[1].events.some((e) => e.event === 'reservation_failed'),
      JSON.stringify(natted[1].events.filter((e) => e.event === 'reachability' || e.event === 'reservation_failed')),
    )
    assert.equal(natted[1].node.relayedAddresses().length, 0)
    assert.equal(relay.reservations(), 1)
  })
})
