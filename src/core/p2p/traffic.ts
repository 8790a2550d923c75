import type {PeerId} from '@libp2p/interface'

/** Peers counted apart in P2PStats.peerBytes; bytes of any further peer are added up under "other". */
const MAX_COUNTED_PEERS = 256

/**
 * Result and model bytes sent and received, in total and per remote peer (its client id when the peer is a run
 * member's ed25519 key, else its peer id). A libp2p service (`traffic()`) the exchanges count into.
 */
export class Traffic {
  bytesSent = 0
  bytesReceived = 0
  /** Of those, the bytes that went through a circuit relay (each crossed the relay's link twice). */
  relayedSent = 0
  relayedReceived = 0
  private readonly perPeer = new Map<string, {in: number; out: number}>()
  private readonly perPeerRelayed = new Map<string, {in: number; out: number}>()

  /** `bytes` exchanged with `peer` (a peer id, or a client id) in `direction`; `relayed`: over a relayed connection. */
  count(peer: PeerId | string, direction: 'in' | 'out', bytes: number, relayed = false): void {
    if (direction === 'in') this.bytesReceived += bytes
    else this.bytesSent += bytes
    const raw = typeof peer !== 'string' && peer.type === 'Ed25519' ? peer.publicKey.raw : undefined
    const key = typeof peer === 'string' ? peer : raw ? Buffer.from(raw).toString('hex') : peer.toString()
    add(this.perPeer, key, direction, bytes)
    if (!relayed) return
    if (direction === 'in') this.relayedReceived += bytes
    else this.relayedSent += bytes
    add(this.perPeerRelayed, key, direction, bytes)
  }

  /** A copy of the per-peer counters. */
  peerBytes(): Record<string, {in: number; out: number}> {
    return Object.fromEntries([...this.perPeer].map(([k, v]) => [k, {...v}]))
  }

  /** A copy of the per-peer counters of relayed bytes (peers we exchanged nothing with through a relay are absent). */
  peerRelayedBytes(): Record<string, {in: number; out: number}> {
    return Object.fromEntries([...this.perPeerRelayed].map(([k, v]) => [k, {...v}]))
  }
}

function add(map: Map<string, {in: number; out: number}>, peer: string, direction: 'in' | 'out', bytes: number): void {
  const key = !map.has(peer) && map.size >= MAX_COUNTED_PEERS ? 'other' : peer
  let b = map.get(key)
  if (!b) map.set(key, (b = {in: 0, out: 0}))
  b[direction] += bytes
}

export function traffic(): () => Traffic {
  return () => new Traffic()
}
