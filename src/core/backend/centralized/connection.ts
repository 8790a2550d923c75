import {EventEmitter} from 'node:events'
import {connect as tcpConnect, type Socket} from 'node:net'
import type {HubRepo} from '../../config/types.js'
import type {AccusationReason, ClientId, CoordinatorState, WitnessProof} from '../../coordinator/types.js'
import type {EquivocationProof} from '../../coordinator/equivocation.js'
import type {ClientReportBody, ClientScore, SaveStatus} from '../../protocol/messages.js'
import type {RewardRow} from '../../coordinator/rewards.js'
import {parseHostPort} from '../../protocol/address.js'
import {PsycheError} from '../../errors.js'
import {DEFAULT_MAX_FRAME_BYTES, FrameReader} from '../../protocol/frames.js'
import type {Identity} from '../../protocol/identity.js'
import {decodeServerMessage, encodeClientMessage, type ClientBodies, type ClientKind, type ServerEnvelope, type StateBody} from '../../protocol/messages.js'
import {applyDelta} from '../../protocol/state-delta.js'
import {serializeState} from '../../coordinator/serialize.js'
import {sha256Hex} from '../../primitives/hash.js'
import type {CoordinatorBackend, PeerDirectory, RejectionInfo} from '../types.js'
import {RETRYABLE_REFUSALS} from './limits.js'
import type {EventLog} from '../../events.js'

interface ConnectOptions {
  /** The server, as host:port. */
  addr: string
  /** The run; '' to watch whichever run the server coordinates (as its challenge names it; with join: false only). */
  runId: string
  identity: Identity
  /** Our libp2p multiaddrs, published to the other clients through the server's peer directory. */
  p2pAddrs: string[]
  /** Ask to join the run (else only watch its state). */
  join: boolean
  /** Reconnect when the link drops: exponential backoff up to 3 s, hello again (default true). */
  reconnect?: boolean
  /** Pin the server's identity id: messages signed by anyone else are refused. */
  serverId?: string
  log?: EventLog
  /** Largest frame accepted from the server (default 16 MiB). */
  maxFrameBytes?: number
  /** How long connect() keeps trying to reach the server before it gives up (default 10 s). */
  connectTimeoutMs?: number
}

const FIRST_BACKOFF_MS = 100
const MAX_BACKOFF_MS = 3000
const HANDSHAKE_TIMEOUT_MS = 10_000
/** Invalid messages from the server tolerated on one link before it is dropped and re-established. */
const MAX_BAD_MESSAGES = 16

/** Why one connection attempt failed: `fatal` when retrying cannot help (the server refused us). */
class AttemptFailed extends Error {
  constructor(
    message: string,
    readonly fatal: boolean,
    readonly code?: string,
  ) {
    super(message)
  }
}

/** One TCP connection and its handshake; a CoordinatorConnection outlives many of them. */
interface Link {
  socket: Socket
  reader: FrameReader
  session?: string
  serverId?: string
  seq: number
  serverSeq: number
  welcomed: boolean
  gotState: boolean
  /** The state revision we hold on this link (undefined: waiting for a whole state). */
  stateRev?: number
  bad: number
}

/**
 * A client's link to the centralized coordinator server (the TCP CoordinatorBackend). Every message
 * is signed with the client's identity and bound to the connection's session; every message from the
 * server is verified (signature, pinned or first-seen server id, session, sequence, run id) and
 * dropped with a logged reason otherwise.
 */
export class CoordinatorConnection extends EventEmitter implements CoordinatorBackend {
  state: CoordinatorState | undefined
  peers: PeerDirectory = {}
  /** The server's identity id (pinned, or as first seen). */
  serverId: string | undefined
  /** The coordinator's circuit relay as we can dial it (from the last welcome; empty: the server runs none). */
  relayAddrs: string[] = []
  private p2pAddrs: string[]
  private link?: Link
  private closed = false
  private replaced = false
  private readonly log: EventLog
  private readonly target: {host: string; port: number}

  private constructor(private readonly opts: ConnectOptions) {
    super()
    this.log = opts.log ?? (() => {})
    this.serverId = opts.serverId
    this.p2pAddrs = opts.p2pAddrs
    this.target = parseHostPort(opts.addr, 'coordinator address')
    this.runId = opts.runId
    if (opts.runId === '' && opts.join) throw new PsycheError('joining a run needs its run id')
  }

  /** The server's clock (the coordinator's `now`) in its last state push. */
  serverTime: number | undefined
  /** As a watcher: each client's latest report forwarded with the state pushes (psyche status reads them). */
  readonly latestReports = new Map<ClientId, ClientReportBody>()
  /** As a watcher (join: false): the verification scores the server keeps, from its latest state push. */
  scores: ClientScore[] = []
  /** As a watcher: each client's rewards (score, accepted rounds, pending, earned and slashed points), likewise. */
  rewards: RewardRow[] = []
  /** As a watcher of a server that saves its state: how its saves are going (undefined: it saves nothing). */
  saveState: SaveStatus | undefined

  /** The run followed: the one asked for, or the server's (runId ''), once its challenge arrived. */
  runId: string

  /** Connects, says hello, and resolves once welcomed and given the first state. A refusal (wrong run id...) is a PsycheError with the server's reason. */
  static async connect(opts: ConnectOptions): Promise<CoordinatorConnection> {
    const c = new CoordinatorConnection(opts)
    const deadline = Date.now() + (opts.connectTimeoutMs ?? 10_000)
    let backoff = FIRST_BACKOFF_MS
    for (;;) {
      try {
        await c.attempt()
        return c
      } catch (error) {
        const failed = error as AttemptFailed
        if (failed.fatal || opts.reconnect === false || Date.now() + backoff > deadline) {
          c.closed = true
          throw new PsycheError(`coordinator ${opts.addr}: ${failed.message}`, {code: failed.code === 'wrong_run_id' ? 'EWRONGRUN' : 'ECOORDINATOR'})
        }
        await new Promise((r) => setTimeout(r, backoff))
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS)
      }
    }
  }

  get connected(): boolean {
    return Boolean(this.link?.gotState && !this.link.socket.destroyed)
  }

  sendWitness(step: number, proof: WitnessProof): boolean {
    return this.send('witness', {proof}, step)
  }

  sendWarmupReady(): boolean {
    return this.send('witness', {proof: {participant_bloom: '', broadcast_bloom: ''}}, this.state?.progress.step ?? 0)
  }

  sendCooldownWitness(step: number, paramHash: string): boolean {
    return this.send('witness', {proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: paramHash}, step)
  }

  sendHealthCheck(step: number, accused: ClientId[]): boolean {
    return this.send('health_check', {accused}, step)
  }

  /** As a witness of `step`: `accused`'s result for it is invalid. */
  sendAccusation(step: number, accused: ClientId, reason: AccusationReason): boolean {
    return this.send('accuse', {accused, reason}, step)
  }

  sendEquivocation(proof: EquivocationProof): boolean {
    return this.send('equivocation', {proof}, proof.a.step)
  }

  /** As a verifier: the scores we gave peers' results of round `step` (the server keeps moving averages for status). */
  sendScores(step: number, scores: {client_id: ClientId; score: number}[]): boolean {
    return this.send('scores', {scores}, step)
  }

  /** What we measured in an applied round (display only: dashboards and status). */
  sendReport(step: number, report: ClientBodies['report']): boolean {
    return this.send('report', report, step)
  }

  sendWithdraw(): boolean {
    return this.send('withdraw', {})
  }

  sendCheckpoint(repo: HubRepo, paramHash?: string): boolean {
    return this.send('checkpoint', paramHash === undefined ? {repo} : {repo, param_hash: paramHash})
  }

  /**
   * Our libp2p addresses changed (a relay reservation, a confirmed observed address): tell the server, whose peer
   * directory then carries them to every client. Later hellos (after a reconnect) carry them too.
   */
  sendAddresses(p2pAddrs: string[]): boolean {
    this.p2pAddrs = p2pAddrs
    return this.send('addresses', {p2p_addrs: p2pAddrs})
  }

  /** Closes the link for good (no reconnect). The server withdraws us if it is configured to. */
  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    const socket = this.link?.socket
    if (socket && !socket.destroyed) {
      await new Promise<void>((resolve) => {
        socket.once('close', () => resolve())
        socket.end()
        setTimeout(() => socket.destroy(), 1000).unref()
      })
    }
    this.emit('closed')
  }

  private send<K extends ClientKind>(kind: K, body: ClientBodies[K], step = this.state?.progress.step ?? 0): boolean {
    const link = this.link
    if (this.closed || !link?.session || !link.welcomed || link.socket.destroyed || !link.socket.writable) return false
    link.seq += 1
    link.socket.write(encodeClientMessage(this.opts.identity, kind, {run_id: this.runId, step, seq: link.seq, session: link.session}, body))
    return true
  }

  /** One connection: resolves after welcome + first state; rejects with AttemptFailed. */
  private attempt(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let settled = false
      const settle = (error?: AttemptFailed) => {
        if (settled) return
        settled = true
        clearTimeout(timer)
        if (error) {
          socket.destroy()
          reject(error)
        } else resolve()
      }
      const socket = tcpConnect({host: this.target.host, port: this.target.port, noDelay: true})
      const link: Link = {socket, reader: new FrameReader(this.opts.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES), seq: 0, serverSeq: 0, welcomed: false, gotState: false, bad: 0}
      this.link = link
      const timer = setTimeout(() => settle(new AttemptFailed(`no welcome and state within ${HANDSHAKE_TIMEOUT_MS} ms`, false)), HANDSHAKE_TIMEOUT_MS)
      socket.on('error', (error: NodeJS.ErrnoException) => settle(new AttemptFailed(`cannot connect: ${error.code ?? error.message}`, false)))
      socket.on('close', () => {
        settle(new AttemptFailed('the server closed the connection', false))
        if (this.link === link) this.onLost(link)
      })
      socket.on('data', (chunk) => {
        try {
          for (const frame of link.reader.push(chunk)) {
            if (!frame.ok) {
              this.log({event: 'server_message_dropped', reason: frame.reason, detail: frame.detail})
              if (frame.fatal) socket.destroy()
              continue
            }
            const outcome = this.onFrame(link, frame.body)
            if (outcome === 'ready') settle()
            else if (outcome instanceof AttemptFailed) settle(outcome)
          }
        } catch (error) {
          this.log({event: 'error', where: 'coordinator connection', message: (error as Error).message})
          socket.destroy()
        }
      })
    })
  }

  /** A new state (whole, or rebuilt from a delta) with the directory changes and scores that came with it. */
  private adopt(link: Link, state: CoordinatorState, body: Omit<StateBody, 'state'>): 'ready' | undefined {
    this.state = state
    // The server sends the directory once (peers_reset) and then only what changed. Unchanged, it stays the same
    // object: a listener tells a new directory by identity instead of comparing N entries on every state.
    if (body.peers_reset || (body.peers_removed?.length ?? 0) > 0 || Object.keys(body.peers).length > 0) {
      const peers: PeerDirectory = body.peers_reset ? {} : {...this.peers}
      for (const gone of body.peers_removed ?? []) delete peers[gone]
      Object.assign(peers, body.peers)
      this.peers = peers
    }
    this.serverTime = body.server_time
    if (body.scores) this.scores = body.scores
    if (body.rewards) this.rewards = body.rewards
    if (body.save_state) this.saveState = body.save_state
    const first = !link.gotState
    link.gotState = true
    this.emit('state', this.state, this.peers)
    // A watcher's reports come with its states (after the state they belong to).
    for (const r of body.reports ?? []) {
      if ((this.latestReports.get(r.client)?.step ?? -1) <= r.step) this.latestReports.set(r.client, r)
      this.emit('client_report', r)
    }
    return first ? 'ready' : undefined
  }

  private drop(link: Link, reason: string, detail: string): undefined {
    this.log({event: 'server_message_dropped', reason, detail})
    if (++link.bad >= MAX_BAD_MESSAGES) link.socket.destroy()
    return undefined
  }

  private onFrame(link: Link, bytes: Buffer): 'ready' | AttemptFailed | undefined {
    const decoded = decodeServerMessage(bytes)
    if (!decoded.ok) return this.drop(link, decoded.reason, decoded.detail)
    const m: ServerEnvelope = decoded.envelope
    if (this.opts.serverId && m.from !== this.opts.serverId) {
      const detail = `signed by ${m.from}, not the pinned server ${this.opts.serverId}`
      // Before the handshake completes this is simply the wrong server: retrying will not make it right.
      if (!link.welcomed) {
        this.log({event: 'server_message_dropped', reason: 'wrong_server', detail})
        return new AttemptFailed(`server identity ${m.from} is not the pinned ${this.opts.serverId}`, true, 'wrong_server')
      }
      return this.drop(link, 'wrong_server', detail)
    }
    if (link.serverId && m.from !== link.serverId) return this.drop(link, 'wrong_server', `signed by ${m.from}, not ${link.serverId} that opened this connection`)
    if (link.session && m.session !== link.session) return this.drop(link, 'wrong_session', 'message bound to another connection')
    if (m.seq <= link.serverSeq) return this.drop(link, 'replayed_seq', `sequence number ${m.seq} is not above ${link.serverSeq}`)
    // challenge and rejected may name another run (we may have dialed the wrong server); welcome and state may not.
    if ((m.kind === 'welcome' || m.kind === 'state' || m.kind === 'state_delta') && m.run_id !== this.runId) return this.drop(link, 'wrong_run_id', `message for run "${m.run_id}"`)
    link.serverSeq = m.seq
    switch (m.kind) {
      case 'challenge': {
        if (link.session) return this.drop(link, 'unexpected', 'a second challenge')
        link.session = m.body.session
        link.serverId = m.from
        if (this.runId === '') this.runId = m.run_id
        if (this.serverId && this.serverId !== m.from) this.log({event: 'server_identity_changed', previous: this.serverId, now: m.from})
        this.serverId = m.from
        link.seq += 1
        const hello = {run_id: this.runId, client_id: this.opts.identity.id, p2p_addrs: this.p2pAddrs, want_join: this.opts.join, state_deltas: true}
        link.socket.write(encodeClientMessage(this.opts.identity, 'hello', {run_id: this.runId, step: this.state?.progress.step ?? 0, seq: link.seq, session: link.session}, hello))
        return undefined
      }
      case 'welcome':
        if (!link.session) return this.drop(link, 'unexpected', 'welcome before challenge')
        if (m.body.client_id !== this.opts.identity.id) return this.drop(link, 'unexpected', `welcome for client ${m.body.client_id}`)
        link.welcomed = true
        this.relayAddrs = m.body.relay_addrs ?? []
        return undefined
      case 'state': {
        if (!link.welcomed) return this.drop(link, 'unexpected', 'state before welcome')
        if (m.body.state.run_id !== this.runId) return this.drop(link, 'wrong_run_id', `state of run "${m.body.state.run_id}"`)
        link.stateRev = m.body.rev
        return this.adopt(link, m.body.state, m.body)
      }
      case 'state_delta': {
        if (!link.welcomed || !link.gotState || !this.state) return this.drop(link, 'unexpected', 'state_delta before a state')
        // Waiting for the whole state asked for (deltas already under way are of no use).
        if (link.stateRev === undefined) return undefined
        let next: CoordinatorState | undefined
        let why: string | undefined
        if (m.body.base !== link.stateRev) why = `its base is revision ${m.body.base}, we hold ${link.stateRev}`
        else {
          try {
            next = applyDelta(this.state, m.body.ops)
            if (sha256Hex(serializeState(next)) !== m.body.hash) why = 'the result does not hash to the state the server has'
            else if (next.run_id !== this.runId) why = `state of run "${next.run_id}"`
          } catch (error) {
            why = (error as Error).message
          }
        }
        if (why !== undefined || !next) {
          this.log({event: 'server_message_dropped', reason: 'state_delta', detail: `${why}; asking for the whole state`})
          link.stateRev = undefined
          this.send('resync', {})
          return undefined
        }
        link.stateRev = m.body.rev
        return this.adopt(link, next, m.body)
      }
      case 'client_report':
        // Forwarded to watchers only (join: false): dashboards follow the clients' losses and bytes.
        if (!link.welcomed) return this.drop(link, 'unexpected', 'client_report before welcome')
        this.emit('client_report', m.body)
        return undefined
      case 'rejected': {
        const info: RejectionInfo = {code: m.body.code, ...(m.body.of ? {of: m.body.of} : {})}
        this.log({event: 'rejected_by_server', code: m.body.code, reason: m.body.reason, ...(m.body.of ? {of: m.body.of} : {})})
        // Refused before we were welcomed: this connection attempt is over. Retrying helps only when the server is
        // at a bound (connections, watchers), not when it refused us (wrong run, ...).
        if (!link.welcomed) return new AttemptFailed(`refused: ${m.body.reason}`, !(RETRYABLE_REFUSALS as readonly string[]).includes(m.body.code), m.body.code)
        // Another process connected with our identity: reconnecting would only take the run back and forth.
        if (m.body.code === 'replaced') this.replaced = true
        this.emit('rejected', m.body.reason, info)
        return undefined
      }
    }
  }

  /** The link dropped: tell listeners, then reconnect with backoff (unless closed or told not to). */
  private onLost(link: Link): void {
    if (!link.gotState) return // a failed attempt: its caller retries
    this.emit('disconnected')
    this.log({event: 'disconnected', addr: this.opts.addr})
    if (this.closed) return
    if (this.opts.reconnect === false || this.replaced) {
      this.closed = true
      this.emit('closed')
      return
    }
    void this.reconnectLoop()
  }

  private async reconnectLoop(): Promise<void> {
    let backoff = FIRST_BACKOFF_MS
    while (!this.closed) {
      await new Promise((r) => setTimeout(r, backoff))
      if (this.closed) return
      try {
        await this.attempt()
        if (this.closed) {
          this.link?.socket.destroy()
          return
        }
        this.log({event: 'reconnected', addr: this.opts.addr})
        this.emit('reconnected')
        return
      } catch (error) {
        const failed = error as AttemptFailed
        if (failed.fatal) {
          this.emit('rejected', failed.message, {code: failed.code ?? 'refused'})
          this.closed = true
          this.emit('closed')
          return
        }
        backoff = Math.min(backoff * 2, MAX_BACKOFF_MS)
      }
    }
  }
}
