import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {PeerId} from '@libp2p/interface'
import {multiaddr, type Multiaddr} from '@multiformats/multiaddr'
import {isOtherPrivateNetwork, localNetworks} from '../../src/core/p2p/addresses.js'
import {dialPlan, peerDialer} from '../../src/core/p2p/dialer.js'
import {peerIdOfClient} from '../../src/core/p2p/peer-id.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'

const P = '12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo'
const R = '12D3KooWRBy97UB99e3J6hiPesre1MZeuNQvfan4gBziswrRJsNK'
const m = (a: string) => multiaddr(a)
// A client on LAN 10.77.10.0/24 (behind its router), as in test/net.
const OURS = ['127.0.0.1/8', '10.77.10.2/24', '::1/128']

describe('which direct addresses lead nowhere from here (pure)', () => {
  it('a private address on none of our networks is some other network', () => {
    assert.equal(isOtherPrivateNetwork(m('/ip4/10.77.11.2/tcp/1'), OURS), true)
    assert.equal(isOtherPrivateNetwork(m('/ip4/192.168.1.5/udp/1/quic-v1'), OURS), true)
    assert.equal(isOtherPrivateNetwork(m('/ip4/172.20.0.3/tcp/1'), OURS), true)
    assert.equal(isOtherPrivateNetwork(m('/ip4/100.64.0.9/tcp/1'), OURS), true)
    assert.equal(isOtherPrivateNetwork(m('/ip6/fd00::5/tcp/1'), OURS), true)
  })

  it('a private address on one of our networks, a public one, loopback, a relayed one and a name are not', () => {
    assert.equal(isOtherPrivateNetwork(m('/ip4/10.77.10.3/tcp/1'), OURS), false)
    assert.equal(isOtherPrivateNetwork(m('/ip4/45.77.0.3/tcp/1'), OURS), false)
    assert.equal(isOtherPrivateNetwork(m('/ip4/172.32.0.1/tcp/1'), OURS), false)
    assert.equal(isOtherPrivateNetwork(m('/ip4/127.0.0.2/tcp/1'), OURS), false)
    assert.equal(isOtherPrivateNetwork(m(`/ip4/10.77.11.1/tcp/9/p2p/${R}/p2p-circuit/p2p/${P}`), OURS), false)
    assert.equal(isOtherPrivateNetwork(m('/dns4/example.org/tcp/1'), OURS), false)
    // Garbage in the network list is ignored, not thrown on.
    assert.equal(isOtherPrivateNetwork(m('/ip4/10.77.10.3/tcp/1'), ['nonsense', '10.77.10.0/x', ...OURS]), false)
  })

  it("this machine's networks include loopback's", () => {
    assert.ok(localNetworks().some((c) => c.startsWith('127.')))
  })
})

describe('the order in which a peer is dialled (pure)', () => {
  const relayed = `/ip4/45.77.0.1/tcp/4001/p2p/${R}/p2p-circuit/p2p/${P}`
  const plan = (addrs: string[], directFailed = false) => dialPlan(addrs.map(m), {directFailed, networks: OURS}).map((a) => [a.kind, a.timeoutMs, a.addrs.map((x) => x.toString())])

  it('a NATed peer (it has a relayed address) is dialled through the relay first when its direct addresses are another LAN', () => {
    const other = [`/ip4/10.77.11.2/udp/4002/quic-v1/p2p/${P}`, `/ip4/10.77.11.2/tcp/4002/p2p/${P}`]
    assert.deepEqual(plan([...other, relayed]), [
      ['relayed', 30_000, [relayed]],
      ['quic', 2_000, [other[0]]],
      ['direct', 2_000, [other[1]]],
    ])
  })

  it("before its relayed address is known, another LAN's private addresses get 2 s each, after its other direct ones", () => {
    const other = [`/ip4/10.77.11.2/udp/4002/quic-v1/p2p/${P}`, `/ip4/10.77.11.2/tcp/4002/p2p/${P}`]
    assert.deepEqual(plan(other), [
      ['quic', 2_000, [other[0]]],
      ['direct', 2_000, [other[1]]],
    ])
    const pub = `/ip4/45.77.0.5/tcp/4002/p2p/${P}`
    assert.deepEqual(plan([...other, pub]), [
      ['direct', 8_000, [pub]],
      ['quic', 2_000, [other[0]]],
      ['direct', 2_000, [other[1]]],
    ])
  })

  it('behind the same router (its private address is on our network) its direct addresses still go first, QUIC first', () => {
    const lan = [`/ip4/10.77.10.3/tcp/4002/p2p/${P}`, `/ip4/10.77.10.3/udp/4002/quic-v1/p2p/${P}`]
    assert.deepEqual(plan([...lan, relayed]), [
      ['quic', 3_000, [lan[1]]],
      ['direct', 8_000, [lan[0]]],
      ['relayed', 30_000, [relayed]],
    ])
    // Once they failed (and are unchanged), the relay goes first.
    assert.deepEqual(plan([...lan, relayed], true), [['relayed', 30_000, [relayed]]])
  })

  it('a peer without a relayed address is dialled at every direct address, whatever the range (a routed private network)', () => {
    const addrs = [`/ip4/10.77.10.7/tcp/4002/p2p/${P}`, `/ip4/45.77.0.5/udp/4002/quic-v1/p2p/${P}`]
    assert.deepEqual(plan(addrs), [
      ['quic', 3_000, [addrs[1]]],
      ['direct', 8_000, [addrs[0]]],
    ])
    // Its direct addresses failed before and it has no relayed one: they are still tried.
    assert.deepEqual(plan(addrs, true), [
      ['quic', 3_000, [addrs[1]]],
      ['direct', 8_000, [addrs[0]]],
    ])
  })

  it("on a retry, another LAN's addresses that already did not answer are left out (never more than the plan above)", () => {
    const other = [`/ip4/10.77.11.2/udp/4002/quic-v1/p2p/${P}`, `/ip4/10.77.11.2/tcp/4002/p2p/${P}`]
    const retry = (addrs: string[]) =>
      dialPlan(addrs.map(m), {directFailed: false, networks: OURS, otherNetworkFailed: true}).map((a) => [a.kind, a.addrs.map((x) => x.toString())])
    assert.deepEqual(retry([...other, relayed]), [['relayed', [relayed]]])
    assert.deepEqual(retry(other), [])
    const pub = `/ip4/45.77.0.5/tcp/4002/p2p/${P}`
    assert.deepEqual(retry([...other, pub]), [['direct', [pub]]])
  })

  it('marks the direct addresses failed only after the last attempt before the relay', () => {
    const lan = [`/ip4/10.77.10.3/udp/4002/quic-v1/p2p/${P}`, `/ip4/10.77.10.3/tcp/4002/p2p/${P}`]
    assert.deepEqual(
      dialPlan([...lan, relayed].map(m), {directFailed: false, networks: OURS}).map((a) => a.marksDirectFailed),
      [false, true, false],
    )
  })
})

describe('overlay dials take turns', () => {
  it('at most 4 at once, every member dialled in the end, and one whose peer dialled us meanwhile is not dialled', async () => {
    const self = peerIdOfClient(generateIdentity().id)
    const peers = Array.from({length: 20}, () => peerIdOfClient(generateIdentity().id))
    const open: {remotePeer: PeerId; status: string; direction: string; remoteAddr: Multiaddr; timeline: {open: number}; streams: never[]}[] = []
    const connection = (peer: PeerId, addr: Multiaddr, direction: string) => ({
      remotePeer: peer,
      status: 'open',
      direction,
      remoteAddr: addr,
      timeline: {open: Date.now()},
      streams: [] as never[],
      addEventListener() {},
      removeEventListener() {},
    })
    let inFlight = 0
    let most = 0
    const dialled: string[] = []
    const connectionManager = {
      getConnections: (peer?: PeerId) => open.filter((c) => !peer || c.remotePeer.equals(peer)),
      openConnection: async (addrs: Multiaddr[]) => {
        most = Math.max(most, ++inFlight)
        await new Promise((r) => setTimeout(r, 20))
        inFlight--
        const peer = peers.find((p) => addrs[0].toString().endsWith(p.toString()))!
        dialled.push(peer.toString())
        const c = connection(peer, addrs[0], 'outbound')
        open.push(c)
        return c
      },
    }
    const dialer = peerDialer({log: () => {}, maxConnections: 64, localNetworks: () => ['127.0.0.1/8']})({
      peerId: self,
      connectionManager: connectionManager as never,
      peerStore: {merge: async () => {}} as never,
    })
    dialer.start()
    try {
      const addrs = peers.map((p, i) => `/ip4/127.0.0.1/tcp/${4000 + i}/p2p/${p}`)
      const done = dialer.connectMembers(addrs)
      // The last member dials us while our dials wait their turn.
      open.push(connection(peers[19], multiaddr(addrs[19]), 'inbound'))
      await done
      assert.ok(most <= 4, `${most} dials at once`)
      assert.equal(most, 4)
      assert.equal(new Set(dialled).size, 19)
      assert.ok(!dialled.includes(peers[19].toString()))
    } finally {
      dialer.stop()
    }
  })
})

describe("a retry does not dial another LAN's addresses again", () => {
  it('they are dialled after the relayed address failed; a retry dials the relayed one alone; a plan dials them all again', async () => {
    // Our peer id below the peer's: a dial refused at once is not waited on for the tie rule (TIE_WINDOW_MS).
    const [self, peer] = [peerIdOfClient(generateIdentity().id), peerIdOfClient(generateIdentity().id)].sort((x, y) => (x.toString() < y.toString() ? -1 : 1))
    const dialled: string[][] = []
    const connectionManager = {
      getConnections: () => [],
      openConnection: async (addrs: Multiaddr[]) => {
        dialled.push(addrs.map((a) => a.toString()))
        throw new Error('unreachable')
      },
    }
    const dialer = peerDialer({log: () => {}, localNetworks: () => OURS})({
      peerId: self,
      connectionManager: connectionManager as never,
      peerStore: {merge: async () => {}} as never,
    })
    dialer.start()
    try {
      const relayedAddr = `/ip4/45.77.0.1/tcp/4001/p2p/${R}/p2p-circuit/p2p/${peer}`
      const other = [`/ip4/10.77.11.2/udp/4002/quic-v1/p2p/${peer}`, `/ip4/10.77.11.2/tcp/4002/p2p/${peer}`]
      const addrs = [...other, relayedAddr]
      await dialer.connectMembers(addrs)
      assert.deepEqual(dialled, [[relayedAddr], [other[0]], [other[1]]])
      assert.equal(dialer.unreachablePeers().length, 1)
      dialled.length = 0
      await dialer.connectMembers(addrs, {retry: true})
      assert.deepEqual(dialled, [[relayedAddr]])
      dialled.length = 0
      // New addresses on that LAN (the peer moved): a retry tries them once.
      const moved = [`/ip4/10.77.11.3/tcp/4002/p2p/${peer}`, relayedAddr]
      await dialer.connectMembers(moved, {retry: true})
      assert.deepEqual(dialled, [[relayedAddr], [moved[0]]])
      dialled.length = 0
      await dialer.connectMembers(addrs)
      assert.deepEqual(dialled, [[relayedAddr], [other[0]], [other[1]]])
      assert.equal(dialer.unreachablePeers().length, 1)
    } finally {
      dialer.stop()
    }
  })
})
