import type {RunConfigFile} from '../../config/types.js'
import type {ClientId, CoordinatorEvent, CoordinatorState} from '../../coordinator/types.js'
import {PsycheError} from '../../errors.js'
import type {EventLog} from '../../events.js'
import {DEFAULT_LIMITS, effectiveMaxConnections, LIMIT_FLAGS, RateLimiter, type RetryableRefusal, type ServerLimits} from './limits.js'

/** Protocol violations a connection may commit before it is closed (each is logged and answered). */
const MAX_STRIKES = 16

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
   * Counts a protocol violation of a connection (a malformed, replayed or misdirected message; the coordinator's own
   * refusals are not counted): the refusal to close it with once it has used up its strikes.
   */
  strike(connection: {strikes: number}): Refusal<'too_many_rejections'> | undefined {
    return ++connection.strikes >= MAX_STRIKES ? {code: 'too_many_rejections', message: `${MAX_STRIKES} invalid messages`} : undefined
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
