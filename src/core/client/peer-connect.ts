import type {PeerDirectory} from '../backend/types.js'
import {EPOCH_PHASES, type ClientId, type CoordinatorState} from '../coordinator/index.js'

/** While members come and go (clients joining), the overlay is planned again at most this often. */
export const CONNECT_MIN_GAP_MS = 2_000
/**
 * How often the members are dialled again while nothing changed (dials that failed are retried, except at the
 * addresses of another LAN that already did not answer: PeerDialer.connectMembers `retry`).
 */
export const CONNECT_RETRY_MS = 5_000

/** What a client last handed its P2P layer the run's members from (runner.ts connectPeers), and when. */
export interface DialedFrom {
  clients: CoordinatorState['epoch']['clients']
  runState: CoordinatorState['run_state']
  peers: PeerDirectory
  at: number
}

/**
 * What to do with the run's members on this state: dial them now (`plan`), dial the failed ones again (`retry`),
 * plan again in `inMs` (churn held back), or nothing. Pure (`notConnected`: of these members, those we dial and are
 * not connected to).
 *
 * States share what did not change (state deltas, and the directory's unchanged entries), so a change is told by
 * identity; parsing every member's addresses on every state cost each client O(N) per state.
 *
 * - At once: the first state; an epoch's clients set or its Warmup begun (the first round needs its connections); a
 *   member of the epoch new to us; new addresses of a member we dial and are not connected to (a peer behind NAT
 *   publishes its relayed address a second after its first ones, and the dialer waits for it rather than dial another
 *   LAN's private addresses: dialer.ts RELAYED_ADDRESS_GRACE_MS).
 * - Churn alone is coalesced: members that came or went (clients joining, up to 32 a second, each arrival moving the
 *   overlay under everyone: a churn of dials and noise handshakes at 256 clients) are planned at most every
 *   CONNECT_MIN_GAP_MS, the last change when the gap ends.
 * - Nothing changed: a retry every CONNECT_RETRY_MS, for the dials that failed.
 */
export function whenToDial(
  last: DialedFrom | undefined,
  state: CoordinatorState,
  peers: PeerDirectory,
  now: number,
  self: ClientId,
  notConnected: (ids: ClientId[]) => ClientId[],
): {dial: 'plan' | 'retry' | 'no'} | {dial: 'later'; inMs: number} {
  if (last === undefined || last.clients !== state.epoch.clients || (state.run_state === 'Warmup' && last.runState !== 'Warmup')) return {dial: 'plan'}
  if (last.peers === peers) return {dial: now - last.at >= CONNECT_RETRY_MS ? 'retry' : 'no'}
  if (EPOCH_PHASES.has(state.run_state) && state.epoch.clients.some((c) => c.id !== self && peers[c.id] !== undefined && last.peers[c.id] === undefined)) return {dial: 'plan'}
  const moved: ClientId[] = []
  for (const id in last.peers) if (id !== self && peers[id] !== undefined && peers[id] !== last.peers[id]) moved.push(id)
  if (moved.length > 0 && notConnected(moved).length > 0) return {dial: 'plan'}
  const wait = last.at + CONNECT_MIN_GAP_MS - now
  return wait <= 0 ? {dial: 'plan'} : {dial: 'later', inMs: wait}
}
