import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {Traffic} from '../../src/core/p2p/traffic.js'

describe('P2P traffic counters', () => {
  it('count relayed bytes apart, in total and per peer, inside the totals', () => {
    const t = new Traffic()
    t.count('aa', 'in', 100)
    t.count('aa', 'out', 40, false)
    t.count('bb', 'in', 700, true)
    t.count('bb', 'out', 300, true)
    t.count('bb', 'in', 50)
    assert.equal(t.bytesReceived, 850)
    assert.equal(t.bytesSent, 340)
    assert.equal(t.relayedReceived, 700)
    assert.equal(t.relayedSent, 300)
    assert.deepEqual(t.peerBytes(), {aa: {in: 100, out: 40}, bb: {in: 750, out: 300}})
    assert.deepEqual(t.peerRelayedBytes(), {bb: {in: 700, out: 300}})
  })

  it('count peers beyond the bound under "other", relayed ones too', () => {
    const t = new Traffic()
    for (let i = 0; i < 300; i++) t.count(`p${i}`, 'in', 1, true)
    assert.equal(Object.keys(t.peerRelayedBytes()).length, 257)
    assert.equal(t.peerRelayedBytes().other.in, 44)
    assert.equal(t.relayedReceived, 300)
  })
})
