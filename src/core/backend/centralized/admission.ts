import type {RunConfigFile} from '../../config/types.js'
import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import {PsycheError} from '../../errors.js'
import type {EventLog} from '../../events.js'
import {DEFAULT_LIMITS, effectiveMaxConnections, LIMIT_FLAGS, RateLimiter, type RetryableRefusal, type ServerLimits} from './limits.js'

/** A refusal of the server's own: a code the peer can act on, and the reason, naming the bound (its flag). */
export interface Refusal<C extends string = string> {
  code: C
  message: string
}

/**
 * The server's limits as given (limits.ts DEFAULT_LIMITS for the rest), checked: every one a positive whole number,
 * the run's client thresholds within the member bound, and the connection bound lowered to what `ulimit -n` leaves
 * room for (logged).
 */
export function serverLimits(run: RunConfigFile, given: Partial<ServerLimits> | undefined, log: EventLog): ServerLimits {
  const limits = {...DEFAULT_LIMITS, ...given}
  for (const [key, value] of Object.entries(limits) as [keyof ServerLimits, number][]) {
    if (!Number.isInteger(value) || value < 1) throw new PsycheError(`${LIMIT_FLAGS[key]}: ${value} is not a positive whole number`, {exitCode: 2, code: 'EUSAGE'})
  }
  const config = run.config!
  if (config.init_min_clients > limits.maxMembers || config.min_clients > limits.maxMembers) {
    throw new PsycheError(
      `${run.path}: config.init_min_clients (${config.init_min_clients}) and config.min_clients (${config.min_clients}) must be at most ${LIMIT_FLAGS.maxMembers} ${limits.maxMembers}`,
      {code: 'ECONFIG'},
    )
  }
  const connections = effectiveMaxConnections(limits.maxConnections)
  if (connections.lowered) log({event: 'limit_lowered', limit: LIMIT_FLAGS.maxConnections, to: connections.max, reason: connections.lowered})
  limits.maxConnections = connections.max
  return limits
}

/**
 * Who may connect, watch and join, and how many violations a connection is allowed: the decisions on what strangers
 * can make the server hold (limits.ts, each bound a flag that a refusal names). The connection table (sessions.ts)
 * counts what is held and asks here; the server asks here before the coordinator sees an event.
 */
export class Admission {
  private readonly joins: RateLimiter
  /** Identities and addresses closed for their refusals, and until when (Date.now() ms) they are refused. */
  private readonly banned = new Map<string, number>()

  constructor(readonly limits: ServerLimits) {
    this.joins = new RateLimiter(limits.joinsPerSecond, () => Date.now(), limits.joinBurst)
  }

  /** Why a new connection is refused (undefined: it is taken), given what is held now. */
  connection(held: {connections: number; fromAddress: number; handshaking: number}, ip: string): Refusal<RetryableRefusal> | undefined {
    const limits = this.limits
    if (held.connections >= limits.maxConnections)
      return {code: 'too_many_connections', message: `the server holds ${limits.maxConnections} connections (${LIMIT_FLAGS.maxConnections})`}
    if (held.fromAddress >= limits.maxConnectionsPerIp)
      return {code: 'too_many_connections_from_address', message: `${ip} has ${limits.maxConnectionsPerIp} connections open (${LIMIT_FLAGS.maxConnectionsPerIp})`}
    if (held.handshaking >= limits.maxHandshakes)
      return {code: 'too_many_handshakes', message: `${limits.maxHandshakes} connections have not said hello yet (${LIMIT_FLAGS.maxHandshakes})`}
    return undefined
  }

  /** Why one more connection may not watch the run (undefined: it may), given how many watch it now. */
  watcher(watchers: number): Refusal<'too_many_watchers'> | undefined {
    const max = this.limits.maxWatchers
    return watchers >= max ? {code: 'too_many_watchers', message: `${max} connections watch the run (${LIMIT_FLAGS.maxWatchers})`} : undefined
  }

  /**
   * Why the server refuses an event before the coordinator sees it: a join when the run is at its member bound, or
   * when joins arrive faster than the server paces them (a join storm). A client already in the run is never refused
   * here; no other event is refused here.
   */
  event(state: CoordinatorState, event: CoordinatorEvent): Refusal | undefined {
    if (event.type !== 'join' || isMember(state, event.id)) return undefined
    const limits = this.limits
    if (memberCount(state) >= limits.maxMembers) return {code: 'run_full', message: `the run has ${limits.maxMembers} members (${LIMIT_FLAGS.maxMembers})`}
    if (!this.joins.take())
      return {
        code: 'join_rate',
        message: `joins are accepted at ${limits.joinsPerSecond} per second after a burst of ${limits.joinBurst} (${LIMIT_FLAGS.joinsPerSecond}, ${LIMIT_FLAGS.joinBurst}); try again shortly`,
      }
    return undefined
  }

  /**
   * Counts a refusal of a connection's message (a malformed, replayed or misdirected message, or one the coordinator
   * refused; not the server's own bounds): the refusal to close it with once it has used up its strikes. Its identity
   * and address are then banned (ban).
   */
  strike(connection: {strikes: number}): Refusal<'too_many_rejections'> | undefined {
    const max = this.limits.maxStrikes
    return ++connection.strikes >= max ? {code: 'too_many_rejections', message: `${max} refused messages (${LIMIT_FLAGS.maxStrikes})`} : undefined
  }

  /** A message of the connection was taken: it earns one strike back (an honest client's occasional late message is no flood). */
  forgive(connection: {strikes: number}): void {
    if (connection.strikes > 0) connection.strikes--
  }

  /** Bans an identity and an address closed for their refusals, for strikeBanSeconds. */
  ban(keys: (string | undefined)[]): void {
    const until = Date.now() + this.limits.strikeBanSeconds * 1000
    for (const key of keys) if (key !== undefined) this.banned.set(key, until)
    // Bounded: the oldest bans go first past 65,536 (each closed connection took 16 refused messages to earn one).
    while (this.banned.size > 65_536) this.banned.delete(this.banned.keys().next().value!)
  }

  /** Why an identity or address is refused now (undefined: it is not banned). */
  banRefusal(key: string): Refusal<'strike_banned'> | undefined {
    const until = this.banned.get(key)
    if (until === undefined) return undefined
    const left = until - Date.now()
    if (left <= 0) {
      this.banned.delete(key)
      return undefined
    }
    return {
      code: 'strike_banned',
      message: `${key} was closed for ${this.limits.maxStrikes} refused messages; it may return in ${Math.ceil(left / 1000)} s (${LIMIT_FLAGS.strikeBanSeconds})`,
    }
  }
}

/** Members of the run: clients waiting to join the next epoch, and the epoch's healthy clients. */
function isMember(state: CoordinatorState, id: ClientId): boolean {
  return state.pending.includes(id) || state.epoch.clients.some((c) => c.id === id && c.state === 'Healthy')
}

function memberCount(state: CoordinatorState): number {
  const ids = new Set(state.pending)
  for (const c of state.epoch.clients) if (c.state === 'Healthy') ids.add(c.id)
  return ids.size
}
