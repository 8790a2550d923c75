import type {ClientId, CoordinatorState} from '../../coordinator/types.js'
import type {PeerDirectory} from '../types.js'

/** Most characters of multiaddrs one member's directory entry keeps (addresses past it are left out, in order). */
export const MAX_DIRECTORY_ENTRY_CHARS = 4096

/** What changed in the directory since a version: `reset` replaces the whole directory with `set`. */
interface DirectoryDelta {
  reset: boolean
  set: PeerDirectory
  removed: ClientId[]
}

/**
 * The server's peer directory: the libp2p addresses of the run's members (never of watchers or strangers), each
 * entry bounded in size, with a version per change so that each connection is sent what changed since the version
 * it last got (a delta), not the whole directory on every change. Removals are remembered as tombstones, at most
 * `maxTombstones`; a connection older than the oldest forgotten one gets the whole directory again (`reset`).
 */
export class PeerBook {
  private version = 0
  private readonly entries = new Map<ClientId, {addrs: string[]; version: number}>()
  private readonly tombstones = new Map<ClientId, number>()
  /** Versions at or below this may have lost tombstones: a connection there needs a reset. */
  private forgottenBelow = 0

  constructor(
    initial: PeerDirectory = {},
    private readonly maxTombstones = 1024,
  ) {
    for (const [id, addrs] of Object.entries(initial)) this.set(id, addrs)
  }

  /** The version of the latest change (0: none yet). */
  get current(): number {
    return this.version
  }

  get size(): number {
    return this.entries.size
  }

  has(id: ClientId): boolean {
    return this.entries.has(id)
  }

  /** The whole directory as a plain object. */
  snapshot(): PeerDirectory {
    const out: PeerDirectory = {}
    for (const [id, e] of this.entries) out[id] = e.addrs
    return out
  }

  /** Whether the entry of `id` is `addrs` (as bounded) already. */
  holds(id: ClientId, addrs: readonly string[]): boolean {
    const kept = boundAddrs(addrs)
    const known = this.entries.get(id)
    return known !== undefined && known.addrs.length === kept.length && known.addrs.every((a, i) => a === kept[i])
  }

  /** Sets a member's addresses (bounded to MAX_DIRECTORY_ENTRY_CHARS); true when anything changed. */
  set(id: ClientId, addrs: readonly string[]): boolean {
    if (this.holds(id, addrs)) return false
    const kept = boundAddrs(addrs)
    this.version += 1
    this.entries.set(id, {addrs: kept, version: this.version})
    this.tombstones.delete(id)
    return true
  }

  /** Removes a member; true when it was there. */
  remove(id: ClientId): boolean {
    if (!this.entries.delete(id)) return false
    this.version += 1
    this.tombstones.set(id, this.version)
    while (this.tombstones.size > this.maxTombstones) {
      const [oldest, v] = this.tombstones.entries().next().value as [ClientId, number]
      this.tombstones.delete(oldest)
      this.forgottenBelow = Math.max(this.forgottenBelow, v)
    }
    return true
  }

  /** Removes the entries of every client that `state` does not list (directoryMembers); true when any was removed. */
  retainListed(state: CoordinatorState): boolean {
    const listed = directoryMembers(state)
    let changed = false
    for (const id of [...this.entries.keys()]) if (!listed.has(id)) changed = this.remove(id) || changed
    return changed
  }

  /** What a connection that has seen version `since` (undefined: nothing yet) needs to be up to date. */
  deltaSince(since: number | undefined): DirectoryDelta {
    if (since === undefined || since < this.forgottenBelow) return {reset: true, set: this.snapshot(), removed: []}
    const set: PeerDirectory = {}
    for (const [id, e] of this.entries) if (e.version > since) set[id] = e.addrs
    const removed: ClientId[] = []
    for (const [id, v] of this.tombstones) if (v > since) removed.push(id)
    return {reset: false, set, removed}
  }
}

/**
 * Who the peer directory lists: the members, and the epoch's clients that left it this round (a dropped trainer's
 * result may still be fetched) until the round ends; never an ejected client, a watcher or a stranger.
 */
export function directoryMembers(state: CoordinatorState): Set<ClientId> {
  const ids = new Set(state.pending)
  for (const c of state.epoch.clients) if (c.state !== 'Ejected') ids.add(c.id)
  return ids
}

/** The addresses in order, as many as fit in MAX_DIRECTORY_ENTRY_CHARS. */
function boundAddrs(addrs: readonly string[]): string[] {
  const out: string[] = []
  let chars = 0
  for (const a of addrs) {
    if (chars + a.length > MAX_DIRECTORY_ENTRY_CHARS) break
    chars += a.length
    out.push(a)
  }
  return out
}
