import {MAX_CLIENTS} from '../../layout/layout-table.js'
export {effectiveMaxConnections, openFileLimit} from '../../descriptors.js'

/**
 * Bounds on what strangers can make the coordinator server hold. Each one is a flag of `psyche server run`
 * (named in `flag`), and a refusal names it.
 */
export interface ServerLimits {
  /** Open client connections at once. */
  maxConnections: number
  /** Open connections from one IP address at once. */
  maxConnectionsPerIp: number
  /** Connections that have not said hello yet, at once (each must within helloTimeoutMs). */
  maxHandshakes: number
  /** Connections that watch the run without joining (psyche status, dashboards). */
  maxWatchers: number
  /** Members of the run at once: clients waiting to join plus the epoch's healthy clients (at most MAX_CLIENTS = 256, the coordinator's capacity, as Psyche's). */
  maxMembers: number
  /** Joins accepted per second, over all connections, once a burst of joinBurst is spent (a token bucket). */
  joinsPerSecond: number
  /** Joins accepted at once before the pace applies (a whole run's worth of clients starting together). */
  joinBurst: number
  /** Bytes queued for one connection that it has not read; past it the connection is closed (a slow reader). */
  maxUnsentBytes: number
  /**
   * Bytes queued for all connections together; past it the connections with the most unread are closed until the
   * total is back under it. What bounds the server's memory however many connections there are.
   */
  maxUnsentBytesTotal: number
  /**
   * Seconds a watcher or a client waiting for the next epoch may leave what it was sent unread; then it is closed.
   * Until then it is sent nothing new (it gets the newest state once it reads again).
   */
  stallTimeoutSeconds: number
  /**
   * Refusals a connection may earn, net, before it is closed: every message refused counts (a watcher's included),
   * every message taken earns one back; the server's own bounds (a full run, the join pace) do not count.
   */
  maxStrikes: number
  /** Seconds the identity and the address of a connection closed for its refusals are refused before they may return. */
  strikeBanSeconds: number
}

export const DEFAULT_LIMITS: ServerLimits = {
  maxConnections: 4096,
  maxConnectionsPerIp: 256,
  maxHandshakes: 256,
  maxWatchers: 256,
  maxMembers: MAX_CLIENTS,
  joinsPerSecond: 32,
  joinBurst: 256,
  maxUnsentBytes: 4 * 1024 * 1024,
  maxUnsentBytesTotal: 64 * 1024 * 1024,
  stallTimeoutSeconds: 60,
  maxStrikes: 16,
  strikeBanSeconds: 60,
}

/** The flag of `psyche server run` that sets each bound (what a refusal names). */
export const LIMIT_FLAGS: Record<keyof ServerLimits, string> = {
  maxConnections: '--max-connections',
  maxConnectionsPerIp: '--max-connections-per-ip',
  maxHandshakes: '--max-handshakes',
  maxWatchers: '--max-watchers',
  maxMembers: '--max-members',
  joinsPerSecond: '--joins-per-second',
  joinBurst: '--join-burst',
  maxUnsentBytes: '--max-unsent-bytes',
  maxUnsentBytesTotal: '--max-unsent-bytes-total',
  stallTimeoutSeconds: '--stall-timeout-s',
  maxStrikes: '--max-strikes',
  strikeBanSeconds: '--strike-ban-s',
}

/**
 * Refusals of a server at one of its bounds: the client tries again later (they are not about who it is).
 * `hello_timeout` too: a client whose hello came late (its process starved of CPU, as 256 clients on one machine
 * are while they start) is no stranger, and a new connection's hello is usually in time.
 */
export const RETRYABLE_REFUSALS = [
  'too_many_connections',
  'too_many_connections_from_address',
  'too_many_handshakes',
  'too_many_watchers',
  'strike_banned',
  'hello_timeout',
] as const
export type RetryableRefusal = (typeof RETRYABLE_REFUSALS)[number]

/** A token bucket: `take()` is true `burst` times at once, then at most `perSecond` times a second on average. */
export class RateLimiter {
  private tokens: number
  private last: number

  constructor(
    private readonly perSecond: number,
    private readonly now: () => number,
    private readonly burst = perSecond,
  ) {
    this.tokens = burst
    this.last = now()
  }

  take(): boolean {
    const t = this.now()
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.perSecond)
    this.last = t
    if (this.tokens < 1) return false
    this.tokens -= 1
    return true
  }
}
