/**
 * Which run members a client keeps connections to. Pure.
 *
 * Up to `fullMeshUpTo` other members, every one (a small run: each announcement straight from its publisher). Past
 * that, a ring of the members sorted by peer id, each dialling the members 1, 2, 4, … 2^k places after it (fewer
 * than the member count): ⌈log2 N⌉ dials out and as many dialled in, about 2·log2 N connections (16 at N = 256)
 * instead of N − 1. Every member computes the same ring from the coordinator's list, so a pair agrees on who dials;
 * the ring's successor links keep the graph connected, and the power-of-two jumps keep any two members within
 * log2 N hops, which gossipsub's mesh, formed over these connections, needs to carry every announcement to everyone.
 * Result transfers with other members open connections on demand (dialer.ts closes them when idle).
 */
interface Overlay {
  /** The members this client dials. */
  dial: string[]
  /** Those and the members that dial this client: the connections kept open. */
  neighbours: Set<string>
  /** True when every member is a neighbour (nothing is closed for being idle). */
  fullMesh: boolean
}

export function overlay(self: string, members: readonly string[], fullMeshUpTo: number): Overlay {
  const others = [...new Set(members)].filter((m) => m !== self)
  if (others.length <= fullMeshUpTo) return {dial: others, neighbours: new Set(others), fullMesh: true}
  const ring = [...others, self].sort()
  const n = ring.length
  const i = ring.indexOf(self)
  const dial = new Set<string>()
  const neighbours = new Set<string>()
  for (let d = 1; d < n; d *= 2) {
    const ahead = ring[(i + d) % n]
    const behind = ring[(i - d + n) % n]
    // A member both d ahead and d behind (d = N/2) would dial us as we dial it: the lower peer id dials.
    if (ahead !== behind || self < ahead) dial.add(ahead)
    neighbours.add(ahead)
    neighbours.add(behind)
  }
  return {dial: [...dial], neighbours, fullMesh: false}
}

/** The default bound on a client's libp2p connections (join --p2p-max-connections). */
export const DEFAULT_MAX_PEER_CONNECTIONS = 32

/** Full mesh while the other members fit in half the connection bound: the rest is for transfers and relays. */
export function fullMeshUpTo(maxConnections: number): number {
  return Math.floor(maxConnections / 2)
}
