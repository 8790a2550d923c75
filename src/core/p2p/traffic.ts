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
  private readonly perPeer = new Map<string, {in: number; out: number}>()

  /** `bytes` exchanged with `peer` (a peer id, or a client id) in `direction`. */
  count(peer: PeerId | string, direction: 'in' | 'out', bytes: number): void {
    if (direction === 'in') this.bytesReceived += bytes
    else this.bytesSent += bytes
    const raw = typeof peer !== 'string' && peer.type === 'Ed25519' ? peer.publicKey.raw : undefined
    let key = typeof peer === 'string' ? peer : raw ? Buffer.from(raw).toString('hex') : peer.toString()
    if (!this.perPeer.has(key) && this.perPeer.size >= MAX_COUNTED_PEERS) key = 'other'
    let b = this.perPeer.get(key)
    if (!b) this.perPeer.set(key, (b = {in: 0, out: 0}))
    b[direction] += bytes
  }

  /** A copy of the per-peer counters. */
  peerBytes(): Record<string, {in: number; out: number}> {
    return Object.fromEntries([...this.perPeer].map(([k, v]) => [k, {...v}]))
  }
}

export function traffic(): () => Traffic {
  return () => new Traffic()
}
