/**
 * The run's relay serves only the run's members (issue 20): a stranger gets no reservation, no relayed connection
 * and no dial-back, and the refusal is logged; a member behind NAT still reserves its slot.
 */
import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {RelayNode} from '../../src/core/p2p/relay.js'
import {waitFor} from '../helpers.js'
import {startNodes, stopAll, testIdentity, type TestNode} from '../p2p/helpers.js'

describe('relay: members only', () => {
  let relay: RelayNode
  let member: TestNode
  let stranger: TestNode
  const events: Record<string, unknown>[] = []
  const members = new Set<string>()
  before(async () => {
    relay = await RelayNode.start({
      identity: testIdentity(),
      listen: ['/ip4/127.0.0.1/tcp/0'],
      log: (e) => events.push(e as Record<string, unknown>),
      admit: (peerId) => members.has(peerId),
    })
    // Both listen on 127.0.0.2 and reach the relay from 127.0.0.1: like clients behind NAT, they need a slot.
    ;[member, stranger] = await startNodes(2, {listen: ['/ip4/127.0.0.2/tcp/0']})
    members.add(member.node.peerId)
  })
  after(async () => {
    await stopAll([member, stranger].filter(Boolean))
    await relay?.stop()
  })

  it('a stranger is refused a slot (logged); a member gets one', async () => {
    const relayAddr = relay.addressFor('127.0.0.1')
    await stranger.node.useRelays(relayAddr).catch(() => {})
    await waitFor(() => events.some((e) => e.event === 'relay_refused' && e.peer_id === stranger.node.peerId), 10_000, 'the relay to log the refusal')
    assert.equal(relay.reservations(), 0, 'no slot for a stranger')
    assert.equal(stranger.node.relayedAddresses().length, 0)
    await member.node.useRelays(relayAddr)
    await waitFor(() => member.node.relayedAddresses().length > 0, 10_000, 'the member’s relayed address')
    assert.equal(relay.reservations(), 1)
    assert.ok(!events.some((e) => e.event === 'relay_refused' && e.peer_id === member.node.peerId))
  })
})
