import type {Socket} from 'node:net'
import {serializeState} from '../../coordinator/index.js'
import type {ClientId, CoordinatorState} from '../../coordinator/types.js'
import {sha256Hex} from '../../primitives/hash.js'
import {diffState} from '../../protocol/state-delta.js'
import type {PeerBook} from './directory.js'
import type {Ledger} from './ledger.js'
import {LIMIT_FLAGS} from './limits.js'
import type {SaveStatus} from '../../protocol/messages.js'
import type {ReportFeed} from './reports.js'

/** How often connections not training in the epoch get the newest state (CoordinatorServerOptions.passiveStateMs). */
export const DEFAULT_PASSIVE_STATE_MS = 1000

/** A state revision the server pushed: its serialization, hash, and the deltas to it from the revisions connections hold. */
interface Revision {
  rev: number
  state?: CoordinatorState
  text: string
  hash: string
  /** Base revision -> the ops from it to this one as JSON (null: send the whole state). */
  deltas: Map<number, string | null>
}

/** What one connection has been sent: the pusher's own record of it. */
interface PushCursor {
  /** The state pushed to this connection last (its dedupe key), so each client gets each state once. */
  lastState?: string
  /** The peer directory version this connection has (undefined: none yet, so its next state carries all of it). */
  peersVersion?: number
  /** The state revision this connection holds (undefined: none yet). */
  stateRev?: number
  /** That revision's state (its next state is a delta from it, however many revisions it is behind). */
  held?: CoordinatorState
  /**
   * Not training in the epoch, it gets states on a cadence (passiveStateMs): at most one in each period of that length,
   * the periods of each connection shifted by `phase` ms so that they do not all fall due on the same tick.
   */
  phase: number
  /** When it was last sent a state (performance.now() ms). */
  pushedAt: number
  /** Since when its output has been backed up, as seen when a state fell due (undefined: it reads). */
  backedUpSince?: number
  /** A watcher: the number of the last client report it was sent (its next state carries the later ones). */
  reportSeq: number
}

/** A new connection's cursor: nothing sent yet; a new watcher gets the recent reports the server keeps with its first state. */
export function newCursor(passiveStateMs: number): PushCursor {
  return {phase: Math.random() * passiveStateMs, pushedAt: performance.now(), reportSeq: 0}
}

/** A connection as the pusher sees it (sessions.ts Session). */
export interface PushTarget {
  readonly socket: Socket
  /** Set once it said hello: only such connections get states. */
  clientId?: ClientId
  /** Replaced by a newer connection of its client: it gets nothing more. */
  replaced: boolean
  /** Watches the run (psyche status, dashboards): its states also carry scores, rewards and client reports. */
  watcher?: boolean
  /** Asked for state deltas in its hello: after a whole state, each change comes as ops on the revision it holds. */
  deltas?: boolean
  readonly pushed: PushCursor
}

/** The connections a pusher serves, and how it sends to them (the connection table, sessions.ts). */
interface PushLinks<S extends PushTarget> {
  readonly all: Iterable<S>
  send(s: S, kind: 'state' | 'state_delta', body: {json: string}): void
  drop(s: S, code: string, reason: string): void
  /** Keeps what all connections have not read under its bound (called after every push). */
  boundUnsent(): void
}

interface PushOptions {
  /** The state the server holds now. */
  state: () => CoordinatorState
  book: PeerBook
  ledger: Ledger
  reports: ReportFeed
  /** A server that saves its state: how its saves are going (watchers get it with their states), and a number that changes whenever that does. */
  saves?: {readonly version: number; status(): SaveStatus}
  /** The coordinator's clock (each state carries the server's time). */
  now: () => number
  /** CoordinatorServerOptions.passiveStateMs (0: every connection gets every change at once). */
  passiveStateMs: number
  /** A connection not training in the epoch that leaves what it was sent unread this long is closed. */
  stallTimeoutSeconds: number
}

/**
 * Pushes states to connections: the epoch's training clients get each change at once (after the turn of the event
 * loop that made it, see the server's flush), everyone else on the passive cadence (pushDue, from the server's timer).
 * Each state is serialized once per revision, and a connection that asked for deltas and holds the previous revision
 * gets the change alone (protocol/state-delta.ts); the peer directory goes as what changed since the version each
 * connection has (directory.ts); watchers also get scores, rewards (ledger.ts) and the clients' reports (reports.ts).
 */
export class StatePusher<S extends PushTarget> {
  /** The epoch's training clients of a state (they get every change at once), computed once per state. */
  private activeOf?: {state: CoordinatorState; ids: Set<ClientId>}
  /** The whole peer directory as JSON at one version (every new connection's first state carries it). */
  private wholeDirectory?: {version: number; json: string}
  /**
   * State revisions (each state the server adopts and pushes gets the next number) and the delta from the previous
   * one, computed once for every connection that holds that one.
   */
  private revision: Revision = {rev: 0, text: '', hash: '', deltas: new Map()}

  constructor(
    private readonly links: PushLinks<S>,
    private readonly opts: PushOptions,
  ) {}

  /**
   * Pushes the state to the given connections (default: the epoch's clients; the rest are served on the passive
   * cadence by pushDue) that have not seen it yet, with what changed in the peer directory since the version each
   * connection has (the whole directory once, on a connection's first state; deltas after).
   */
  push(to?: Iterable<S>): void {
    const rev = this.revise()
    const version = this.opts.book.current
    const now = this.opts.now()
    const head = `{"state":${JSON.stringify(rev.text)},"rev":${rev.rev},"server_time":${now}`
    // A client that asked for deltas and holds a revision (all of them after their first state) gets what changed
    // since: with N clients a whole state per event was O(N²) bytes and signatures. A connection on the passive
    // cadence (a joiner waiting for the next epoch) is several revisions behind at each of its states: it too gets
    // the changes since the one it holds (they were whole states, 216 MB a round from the server at 256 clients).
    const deltaHead = (base: number, held: CoordinatorState) => {
      const ops = base === rev.rev ? '[]' : this.deltaFrom(base, held)
      return ops == null ? undefined : `{"base":${base},"rev":${rev.rev},"ops":${ops},"hash":"${rev.hash}","server_time":${now}`
    }
    // Serialized once per directory version the connections are at (nearly all at the same one); each frame still
    // signs its own session and sequence number.
    const peerParts = new Map<number | undefined, string>()
    const peersFor = (since: number | undefined): string => {
      let part = peerParts.get(since)
      if (part === undefined && since === undefined && this.wholeDirectory?.version === version) part = this.wholeDirectory.json
      if (part === undefined) {
        const delta = this.opts.book.deltaSince(since)
        part = `,"peers":${JSON.stringify(delta.set)}${delta.reset ? ',"peers_reset":true' : ''}${delta.removed.length > 0 ? `,"peers_removed":${JSON.stringify(delta.removed)}` : ''}`
        peerParts.set(since, part)
        if (since === undefined) this.wholeDirectory = {version, json: part}
      }
      return part
    }
    const at = performance.now()
    for (const s of to ?? this.links.all) {
      if (!s.clientId || s.replaced || (to === undefined && !this.isActive(s))) continue
      const c = s.pushed
      const key = this.stateKey(s, rev.rev)
      if (c.lastState === key && c.peersVersion === version) continue
      const asDelta = s.deltas && c.stateRev !== undefined && c.held !== undefined ? deltaHead(c.stateRev, c.held) : undefined
      const body = `${asDelta ?? head}${peersFor(c.peersVersion)}`
      c.lastState = key
      c.peersVersion = version
      c.stateRev = rev.rev
      c.held = rev.state
      c.pushedAt = at
      // Watchers (status, dashboards) also get the verification scores and rewards, and the reports since their last
      // state; training clients do not need them.
      const json = s.watcher ? `${body}${this.opts.ledger.watcherJson(this.opts.state())}${this.savesPart()}${this.reportsFor(s)}}` : `${body}}`
      this.links.send(s, asDelta ? 'state_delta' : 'state', {json})
    }
    this.links.boundUnsent()
  }

  /** The states due to connections on the passive cadence (the server's timer calls it after each tick). */
  pushDue(): void {
    if (this.opts.passiveStateMs <= 0) return
    const period = this.opts.passiveStateMs
    const at = performance.now()
    const rev = this.revise().rev
    const version = this.opts.book.current
    const due: S[] = []
    for (const s of this.links.all) {
      if (!s.clientId || s.replaced || this.isActive(s)) continue
      const c = s.pushed
      // Due once a new period of its own has begun since its last state.
      if (Math.floor((at - c.phase) / period) <= Math.floor((c.pushedAt - c.phase) / period)) continue
      // One that has not read what it was sent gets nothing new (it gets the newest state once it reads again): a
      // connection that never reads costs what the kernel's buffers took, then nothing, until it is closed.
      if (s.socket.writableLength > 0) {
        c.backedUpSince ??= at
        const limit = this.opts.stallTimeoutSeconds
        if (at - c.backedUpSince > limit * 1000) this.links.drop(s, 'slow_consumer', `it has not read what it was sent for ${limit} s (${LIMIT_FLAGS.stallTimeoutSeconds})`)
        continue
      }
      c.backedUpSince = undefined
      if (c.lastState !== this.stateKey(s, rev) || c.peersVersion !== version) due.push(s)
    }
    if (due.length > 0) this.push(due)
  }

  /** The connection asked for a whole state (a delta did not apply on its side): it gets one now. */
  resync(s: S): void {
    s.pushed.stateRev = undefined
    s.pushed.held = undefined
    s.pushed.lastState = undefined
    this.push([s])
  }

  /** A connection of one of the epoch's training clients: it gets every state change at once. */
  private isActive(s: S): boolean {
    if (this.opts.passiveStateMs <= 0) return true
    if (s.watcher || !s.clientId) return false
    const state = this.opts.state()
    if (this.activeOf?.state !== state) {
      const ids = new Set<ClientId>()
      for (const c of state.epoch.clients) if (c.state === 'Healthy') ids.add(c.id)
      this.activeOf = {state, ids}
    }
    return this.activeOf.ids.has(s.clientId)
  }

  /** What a connection has seen when it is up to date: the state's revision (and, for a watcher, its reports, scores and rewards). */
  private stateKey(s: S, rev: number): string {
    return s.watcher ? `${rev}\0${this.opts.reports.latest}\0${this.opts.ledger.version}\0${this.opts.saves?.version ?? 0}` : `${rev}`
  }

  /** How the server's saves are going, as the `save_state` part of a watcher's state (empty when it saves nothing). */
  private savesPart(): string {
    return this.opts.saves ? `,"save_state":${JSON.stringify(this.opts.saves.status())}` : ''
  }

  /** The reports a watcher has not had yet, as the `reports` part of its state (empty when none). */
  private reportsFor(s: S): string {
    const part = this.opts.reports.since(s.pushed.reportSeq)
    s.pushed.reportSeq = this.opts.reports.latest
    return part
  }

  /** The current state's revision: a new one when the state changed since the last push. */
  private revise(): Revision {
    const r = this.revision
    const current = this.opts.state()
    if (r.state === current) return r
    const text = serializeState(current)
    if (r.state !== undefined && text === r.text) {
      r.state = current
      return r
    }
    this.revision = {rev: r.rev + 1, state: current, text, hash: sha256Hex(text), deltas: new Map()}
    return this.revision
  }

  /**
   * The ops from revision `base` (whose state is `held`) to the current one, as JSON, computed once per base for
   * every connection there; null when no delta can express it, or when it would be larger than the whole state.
   */
  private deltaFrom(base: number, held: CoordinatorState): string | null {
    const r = this.revision
    let json = r.deltas.get(base)
    if (json === undefined) {
      const ops = diffState(held, r.state!)
      json = ops ? JSON.stringify(ops) : null
      if (json !== null && json.length > r.text.length) json = null
      r.deltas.set(base, json)
    }
    return json
  }
}
