import assert from 'node:assert/strict'
import {test} from 'node:test'
import {multiaddr} from '@multiformats/multiaddr'
import {addrPeerId, parseMultiaddrs, publishableAddrs} from '../../src/core/p2p/addresses.js'
import {P2PNode} from '../../src/core/p2p/index.js'
import {generateIdentity} from '../../src/core/protocol/index.js'

const P = '12D3KooWEpKArcTVXmsvnSHXKedZqB8A8NXJKRKJ96rAn5YVtCD1'
const R = '12D3KooWAeU6wBL12imKgS8Fh8ZFJStwGBqn7BqarZ12JXLPqx5m'
const m = (xs: string[]) => xs.map((x) => multiaddr(x))

test('a node on every interface never tells peers its loopback, unspecified or link-local addresses; relayed ones come last', () => {
  const out = publishableAddrs(
    m([
      `/ip4/127.0.0.1/tcp/4001/p2p/${P}`,
      `/ip4/203.0.113.7/tcp/4001/p2p/${R}/p2p-circuit/p2p/${P}`,
      `/ip4/127.0.0.1/tcp/9/p2p/${R}/p2p-circuit/p2p/${P}`,
      `/ip4/10.77.10.2/tcp/4001/p2p/${P}`,
      `/ip4/0.0.0.0/tcp/4001/p2p/${P}`,
      `/ip6/::1/tcp/4001/p2p/${P}`,
      `/ip6/fe80::1/tcp/4001/p2p/${P}`,
      `/ip4/169.254.1.1/tcp/4001/p2p/${P}`,
      `/ip4/10.77.10.2/tcp/4001/p2p/${P}`,
    ]),
  )
  assert.deepEqual(out, [`/ip4/10.77.10.2/tcp/4001/p2p/${P}`, `/ip4/203.0.113.7/tcp/4001/p2p/${R}/p2p-circuit/p2p/${P}`])
})

test('a node reachable only through loopback (one-machine testnet) tells its loopback addresses', () => {
  assert.deepEqual(publishableAddrs(m([`/ip4/127.0.0.1/tcp/4001/p2p/${P}`, `/ip6/::1/tcp/4001/p2p/${P}`])), [`/ip4/127.0.0.1/tcp/4001/p2p/${P}`, `/ip6/::1/tcp/4001/p2p/${P}`])
  assert.deepEqual(publishableAddrs([]), [])
})

test('the peer id of an address is its last /p2p (none for a bare relay circuit)', () => {
  assert.equal(addrPeerId(multiaddr(`/ip4/1.2.3.4/tcp/1/p2p/${R}/p2p-circuit/p2p/${P}`)), P)
  assert.equal(addrPeerId(multiaddr(`/ip4/1.2.3.4/tcp/1/p2p/${R}/p2p-circuit`)), undefined)
  assert.equal(addrPeerId(multiaddr('/ip4/1.2.3.4/tcp/1')), undefined)
})

test('flags with a bad multiaddr fail with an error naming the flag and the address', () => {
  assert.throws(() => parseMultiaddrs(['nonsense'], '--p2p-listen'), /--p2p-listen nonsense: not a multiaddr/)
  assert.throws(() => parseMultiaddrs(['/ip4/1.2.3.4/udp/1'], '--p2p-announce'), /--p2p-announce \/ip4\/1.2.3.4\/udp\/1: .*\/tcp\/PORT/)
  assert.throws(() => parseMultiaddrs(['/ip4/1.2.3.4/tcp/1'], '--relay', {needPeer: true}), /--relay .*must end in \/p2p\//)
  assert.deepEqual(parseMultiaddrs([`/ip4/1.2.3.4/tcp/1/p2p/${R}`], '--relay', {needPeer: true}), [`/ip4/1.2.3.4/tcp/1/p2p/${R}`])
  // The relay listens on QUIC too (psyche relay prints both): either may be given.
  assert.deepEqual(parseMultiaddrs([`/ip4/1.2.3.4/udp/1/quic-v1/p2p/${R}`], '--relay', {needPeer: true}), [`/ip4/1.2.3.4/udp/1/quic-v1/p2p/${R}`])
})

test('a node listening on every interface (the default) publishes no loopback address; --p2p-announce replaces what it publishes', async () => {
  const node = await P2PNode.start({identity: generateIdentity(), runId: 'r', relay: false})
  try {
    assert.ok(
      node.allAddresses().some((a) => a.startsWith('/ip4/127.0.0.1/')),
      `listens on loopback too: ${node.allAddresses()}`,
    )
    assert.ok(
      node.addresses().every((a) => !a.startsWith('/ip4/127.') && a.endsWith(`/p2p/${node.peerId}`)),
      node.addresses().join(' '),
    )
  } finally {
    await node.stop()
  }
  const announced = await P2PNode.start({identity: generateIdentity(), runId: 'r', relay: false, listen: ['/ip4/127.0.0.1/tcp/0'], announce: ['/ip4/203.0.113.7/tcp/4001']})
  try {
    assert.deepEqual(announced.addresses(), [`/ip4/203.0.113.7/tcp/4001/p2p/${announced.peerId}`])
  } finally {
    await announced.stop()
  }
})
