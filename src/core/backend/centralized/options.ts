import type {RunConfigFile} from '../../config/types.js'
import type {EventLog} from '../../events.js'
import type {Identity} from '../../protocol/identity.js'
import type {ServerLimits} from './limits.js'

/** What a CoordinatorServer is started with (psyche server run's flags, and tests'). */
export interface CoordinatorServerOptions {
  run: RunConfigFile
  /** Default 127.0.0.1; 0.0.0.0 to serve other machines. */
  host?: string
  /** 0 (default): any free port. */
  port?: number
  /** Save the state after every transition here (created if missing), and resume from it on start. */
  saveStateDir?: string
  /**
   * Saves that may fail in a row (each change is saved, and a failed save is tried again every second) before the
   * server halts: it starts no more rounds, takes no more events, and `halted` resolves (psyche server run exits 1).
   * Default DEFAULT_MAX_SAVE_FAILURES.
   */
  maxSaveFailures?: number
  /** Withdraw a client from the run when its connection closes (default true, as Psyche). */
  withdrawOnDisconnect?: boolean
  /** How often the coordinator is ticked, besides after every accepted event (default 50 ms: how late a timeout may fire). */
  tickIntervalMs?: number
  /** The server's signing identity. Default: the one saved in saveStateDir, else a new random one. */
  identity?: Identity
  /** Structured log lines ({event: ..., ...}); rejections among them with the peer and the reason. */
  log?: EventLog
  /** The coordinator's clock: unix milliseconds (default: Date.now). */
  now?: () => number
  /** Largest frame accepted from a client once it said hello (default 16 MiB; 64 KiB before). */
  maxFrameBytes?: number
  /**
   * Bounds on what strangers can make the server hold (limits.ts: DEFAULT_LIMITS; each a flag of psyche server run).
   * The connection bound is lowered to what `ulimit -n` leaves room for.
   */
  limits?: Partial<ServerLimits>
  /** A connection must say hello within this time (default 10 s). */
  helloTimeoutMs?: number
  /**
   * The run's circuit relay (psyche server run starts one): each client is told its addresses in the welcome, as
   * that client can dial them (`localAddress`: the server address its TCP connection arrived on).
   */
  relayAddrs?: (localAddress: string | undefined) => string[]
  /**
   * How often a connection that is not training in the epoch (a watcher, a client waiting for the next epoch) gets the
   * newest state, in milliseconds (default 1000; 0: at every change, as the epoch's clients). The epoch's clients get
   * each change at once; the rest, however many, cannot make the server sign and send a frame each per change.
   */
  passiveStateMs?: number
  /**
   * The entropy mixed into the seed of each round this server starts (coordinator tick/witness entropy, as the Solana
   * program mixes its clock's slot:unix_timestamp). Default: the server's clock, a count, and 16 random bytes, fresh at
   * every tick and every witness, so no client can work out a round's witnesses or batches before the round starts.
   * Tests give a fixed one to reproduce a run.
   */
  entropy?: () => string
}
