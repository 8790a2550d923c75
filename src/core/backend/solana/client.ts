import {EventEmitter} from 'node:events'
import type {Address, Instruction, KeyPairSigner} from '@solana/kit'
import type {HubRepo} from '../../config/types.js'
import {EPOCH_PHASES, tick, type AccusationReason, type ClientId, type CoordinatorState, type WitnessProof} from '../../coordinator/index.js'
import {PsycheError, errorMessage} from '../../errors.js'
import type {EquivocationProof} from '../../coordinator/equivocation.js'
import type {BackendConnector, CoordinatorBackend, JoinRequest, PeerDirectory, RejectionInfo} from '../types.js'
import {authorizationAddress} from './authorizer.js'
import type {Chain, SendResult} from './chain.js'
import {
  accuseInstruction,
  reportScoresInstruction,
  checkpointInstruction,
  hashWitnessInstruction,
  coordinatorAddress,
  equivocationInstructions,
  HEALTH_CHECK_BATCH,
  healthCheckInstruction,
  joinRunInstruction,
  peerAddress,
  setPeerInstruction,
  tickInstruction,
  warmupWitnessInstruction,
  withdrawInstruction,
  witnessInstruction,
} from './instructions.js'
import {
  PEER_SIZE,
  REPORT_SCORES_MAX,
  addressOfClient,
  fitPeerAddrs,
  clientIdOf,
  decodeCoordinator,
  decodeLedger,
  decodePeer,
  ledgerScores,
  type OnChainCoordinator,
} from './layout.js'
import {scoreToFixed} from '../../coordinator/rewards.js'
import {subscribeAccount} from './watch.js'
import type {EventLog} from '../../events.js'

/**
 * The Solana CoordinatorBackend: a client of a run whose coordinator is the on-chain program. It reads the
 * coordinator account (a validator's accountSubscribe, or polling), publishes its libp2p addresses in its own peer
 * record (set_peer) and reads the others' for the peer directory, sends its messages as the program's instructions
 * (signed by its key: the client id is that key in hex), and ticks the run when the reference says a tick would
 * change it (tick is permissionless; clients take turns by their position, so one usually ticks).
 */

interface SolanaBackendOptions {
  chain: Chain
  programId: Address
  runId: string
  /** The client's key: signs and pays for its transactions; its public key in hex is the client id. */
  signer: KeyPairSigner
  /**
   * A permissioned run's authorization (the authorizer program's account) that admits this key. Default: the join
   * authority's grant to this key, else its grant to anyone.
   */
  authorization?: Address
  /** A validator's websocket: follow the coordinator with accountSubscribe (else poll every pollMs). */
  wsUrl?: string
  /** How often the account is polled (without wsUrl), a tick considered and peer records re-read; default 500 ms. */
  pollMs?: number
  /** Re-read every peer record at least this often (addresses change); default 5000 ms. */
  peerRefreshMs?: number
  /** Time as the client sees it (default: the system clock). */
  clock?: {now(): number; sleep(ms: number): Promise<void>}
  /** The cluster clock as the program reads it, in unix ms (default clock.now()): when a tick is due. */
  chainNow?: () => number
  /** How long each position waits its turn before ticking a due transition (default 1000 ms). */
  tickStaggerMs?: number
  /** Send ticks (default true). */
  tick?: boolean
  log?: EventLog
}

const systemClock = {now: () => Date.now(), sleep: (ms: number) => new Promise<void>((r) => setTimeout(r, ms))}

/** A connector: each connect() is a fresh backend (publishes the peer record, joins unless already in). */
export class SolanaConnector implements BackendConnector {
  readonly description: string

  constructor(private readonly opts: SolanaBackendOptions) {
    this.description = `Solana run ${opts.runId} (program ${opts.programId})`
  }

  connect(join: JoinRequest): Promise<SolanaBackend> {
    return SolanaBackend.open(this.opts, join)
  }
}

export class SolanaBackend extends EventEmitter implements CoordinatorBackend {
  state: CoordinatorState | undefined
  peers: PeerDirectory = {}
  /** The coordinator account's extras (authorities) as last read. */
  onChain: OnChainCoordinator | undefined
  readonly id: ClientId
  private closed = false
  private lastData: Buffer | undefined
  private readonly peerCache = new Map<ClientId, {addrs: string[]; at: number}>()
  private readonly peerRecords = new Map<ClientId, Address>()
  private queue: Promise<void> = Promise.resolve()
  private busy = 0
  private refreshing: Promise<void> | undefined
  private tickDueSince: number | undefined
  private tickSentFor: string | undefined
  private offline = false
  private readonly abort = new AbortController()
  private readonly clock: NonNullable<SolanaBackendOptions['clock']>
  private readonly log: EventLog
  private coordinator!: Address
  private ownRecord!: Address
  private peerRent = 0n
  private loop: Promise<void> | undefined
  private idleWaiters: (() => void)[] = []

  private constructor(private readonly opts: SolanaBackendOptions) {
    super()
    this.id = clientIdOf(opts.signer.address)
    this.clock = opts.clock ?? systemClock
    this.log = opts.log ?? (() => {})
  }

  /** Publishes our addresses, joins the run (unless already in it) and resolves with the first state read. */
  static async open(opts: SolanaBackendOptions, join: JoinRequest): Promise<SolanaBackend> {
    const b = new SolanaBackend(opts)
    try {
      await b.start(join)
    } catch (error) {
      b.closed = true
      b.abort.abort()
      throw error
    }
    return b
  }

  private async start(join: JoinRequest): Promise<void> {
    const {chain, programId, runId, signer} = this.opts
    this.coordinator = await coordinatorAddress(programId, runId)
    this.ownRecord = await peerAddress(programId, this.coordinator, signer.address)
    this.peerRent = await chain.minimumBalance(PEER_SIZE)
    const data = await chain.fetchAccount(this.coordinator)
    if (!data) throw new PsycheError(`run ${JSON.stringify(runId)}: no coordinator account ${this.coordinator} (create it with psyche create-run)`, {code: 'ENORUN'})
    this.take(data)
    const run = this.onChain!
    if (join.p2pAddrs.length > 0) this.check(await chain.send(signer, [this.setPeer(join.p2pAddrs)]), 'publishing our addresses (set_peer)')
    if (this.needsJoin(this.state!)) {
      const authorization = await this.authorizationFor(run)
      const r = await chain.send(signer, [joinRunInstruction(programId, this.coordinator, signer, authorization)])
      if (!r.ok && r.error !== 'AlreadyJoined') this.check(r, `joining run ${runId}`)
      this.log({event: 'joined', client_id: this.id, address: signer.address})
    }
    await this.refresh(true)
    if (this.opts.wsUrl) this.follow(this.opts.wsUrl)
    this.loop = this.run()
  }

  private needsJoin(s: CoordinatorState): boolean {
    if (s.pending.includes(this.id)) return false
    const c = s.epoch.clients.find((x) => x.id === this.id)
    return !(c?.state === 'Healthy' && EPOCH_PHASES.has(s.run_state))
  }

  /** The authorization account a permissioned run needs from us (undefined: the run is open, or we are its join authority). */
  private async authorizationFor(run: OnChainCoordinator): Promise<Address | undefined> {
    if (!run.join_authority || run.join_authority === this.opts.signer.address) return undefined
    if (this.opts.authorization) return this.opts.authorization
    const mine = await authorizationAddress(run.authorizer, run.join_authority, this.opts.signer.address)
    if (await this.opts.chain.fetchAccount(mine)) return mine
    const anyone = await authorizationAddress(run.authorizer, run.join_authority, '11111111111111111111111111111111' as Address)
    if (await this.opts.chain.fetchAccount(anyone)) return anyone
    throw new PsycheError(
      `run ${this.opts.runId} is permissioned: no authorization from its join authority ${run.join_authority} to ${this.opts.signer.address} (psyche authorize grant), or pass the delegating grantee's with --authorization`,
      {code: 'ENOTPERMITTED'},
    )
  }

  private check(r: SendResult, what: string): void {
    if (r.ok) return
    const why = r.logs.filter((l) => l.startsWith('Program log: ')).map((l) => l.slice('Program log: '.length))
    throw new PsycheError(`${this.description()}: ${what} refused: ${r.error}${why.length ? ` (${why.join('; ')})` : ''}`, {code: 'EREFUSED'})
  }

  private description(): string {
    return `Solana run ${this.opts.runId}`
  }

  private setPeer(addrs: string[]): Instruction {
    return setPeerInstruction(this.opts.programId, this.coordinator, this.opts.signer, this.ownRecord, fitPeerAddrs(addrs), this.peerRent)
  }

  // ---- reading ----

  /** Takes new coordinator bytes; true when the state changed. Undecodable bytes are logged and ignored. */
  private take(data: Uint8Array): boolean {
    const bytes = Buffer.from(data)
    if (this.lastData?.equals(bytes)) return false
    let decoded: OnChainCoordinator
    try {
      decoded = decodeCoordinator(bytes)
    } catch (error) {
      this.log({event: 'coordinator_account_invalid', message: errorMessage(error)})
      return false
    }
    this.lastData = bytes
    this.onChain = decoded
    this.state = decoded.state
    this.tickDueSince = undefined
    return true
  }

  /** Reads the coordinator (unless a subscription delivers it) and the peer records; emits 'state' on a change. */
  private refresh(readAccount = !this.opts.wsUrl): Promise<void> {
    this.refreshing ??= (async () => {
      try {
        let changed = false
        if (readAccount) {
          const data = await this.opts.chain.fetchAccount(this.coordinator)
          if (!data) throw new PsycheError(`the coordinator account of run ${this.opts.runId} is gone (freed)`, {code: 'ENORUN'})
          changed = this.take(data)
        }
        const peersChanged = await this.refreshPeers()
        if (this.offline) {
          this.offline = false
          this.log({event: 'reconnected', rpc: 'ok'})
          this.emit('reconnected')
        }
        if ((changed || peersChanged) && !this.closed && this.state) this.emit('state', this.state, this.peers)
      } finally {
        this.refreshing = undefined
        this.wakeIdle()
      }
    })()
    return this.refreshing
  }

  /** Re-reads the peer records of the run's clients and joiners that are new or not read for a while. */
  private async refreshPeers(): Promise<boolean> {
    const s = this.state
    if (!s) return false
    const ids = [...new Set([...s.epoch.clients.map((c) => c.id), ...s.pending])]
    const now = this.clock.now()
    const refreshMs = this.opts.peerRefreshMs ?? 5000
    let changed = false
    for (const id of ids) {
      const cached = this.peerCache.get(id)
      // A client without a record yet is looked for again at every refresh (it publishes right before it joins).
      if (cached && cached.addrs.length > 0 && now - cached.at < refreshMs) continue
      let record = this.peerRecords.get(id)
      if (!record) this.peerRecords.set(id, (record = await peerAddress(this.opts.programId, this.coordinator, addressOfClient(id))))
      const data = await this.opts.chain.fetchAccount(record)
      let addrs: string[] = []
      if (data) {
        try {
          const p = decodePeer(data)
          if (p.client === id && p.coordinator === this.coordinator) addrs = p.addrs
        } catch (error) {
          this.log({event: 'peer_record_invalid', client_id: id, message: errorMessage(error)})
        }
      }
      if (!cached || cached.addrs.join('\n') !== addrs.join('\n')) changed = true
      this.peerCache.set(id, {addrs, at: now})
    }
    const known = new Set(ids)
    const peers: PeerDirectory = {}
    for (const [id, p] of this.peerCache) if (known.has(id) && p.addrs.length > 0) peers[id] = p.addrs
    if (Object.keys(peers).length !== Object.keys(this.peers).length) changed = true
    if (changed) this.peers = peers
    return changed
  }

  private follow(wsUrl: string): void {
    subscribeAccount(
      wsUrl,
      this.coordinator,
      (data) => {
        if (this.take(data) && !this.closed) {
          void this.refreshPeers().then((peersChanged) => {
            if (!this.closed && this.state) this.emit('state', this.state, this.peers)
            if (peersChanged) this.log({event: 'peers_changed', peers: Object.keys(this.peers).length})
          })
        }
      },
      this.abort.signal,
    ).catch((error: unknown) => {
      if (this.closed) return
      // Without the subscription we poll: slower to notice, never stuck.
      this.log({event: 'subscription_failed', ws_rpc: wsUrl, message: errorMessage(error)})
      this.opts.wsUrl = undefined
    })
  }

  /** Polls (or, with a subscription, re-reads peers) and ticks, until closed. */
  private async run(): Promise<void> {
    const pollMs = this.opts.pollMs ?? 500
    const aborted = new Promise<void>((r) => this.abort.signal.addEventListener('abort', () => r(), {once: true}))
    while (!this.closed) {
      await Promise.race([this.clock.sleep(pollMs), aborted])
      if (this.closed) return
      try {
        await this.refresh()
        await this.maybeTick()
      } catch (error) {
        if (this.closed) return
        if (!this.offline) {
          this.offline = true
          this.log({event: 'disconnected', message: errorMessage(error)})
          this.emit('disconnected')
        }
      }
    }
  }

  /**
   * Sends a tick when the reference says one would change the run at the chain's time (a timeout passed). Clients
   * take turns: the one at position k (of the run's clients and joiners, by id) waits k × tickStaggerMs first.
   */
  private async maybeTick(): Promise<void> {
    const s = this.state
    if (this.opts.tick === false || !s || this.closed) return
    const now = Math.floor((this.opts.chainNow ? this.opts.chainNow() : this.clock.now()) / 1000) * 1000
    let next: CoordinatorState
    try {
      next = tick(s, now)
    } catch {
      return
    }
    if (next === s || JSON.stringify(next) === JSON.stringify(s)) {
      this.tickDueSince = undefined
      return
    }
    const key = `${s.run_state}@${s.run_state_start}:${s.progress.step}:${s.pending.length}`
    if (this.tickSentFor === key) return
    this.tickDueSince ??= this.clock.now()
    const order = [...new Set([...s.epoch.clients.filter((c) => c.state === 'Healthy').map((c) => c.id), ...s.pending])].sort()
    const position = Math.max(0, order.indexOf(this.id))
    if (this.clock.now() - this.tickDueSince < position * (this.opts.tickStaggerMs ?? 1000)) return
    this.tickSentFor = key
    const closesRound = s.run_state === 'RoundWitness'
    this.enqueue('tick', () => tickInstruction(this.opts.programId, this.coordinator, closesRound), true)
  }

  // ---- sending ----

  /** Sends one instruction after those before it; a refusal is a 'rejected' event. False once closed. */
  private enqueue(of: string, build: () => Instruction | Instruction[], quiet = false): boolean {
    if (this.closed) return false
    this.busy++
    this.queue = this.queue
      .then(async () => {
        if (this.closed) return
        const built = build()
        const r = await this.opts.chain.send(this.opts.signer, Array.isArray(built) ? built : [built])
        if (r.ok) {
          await this.refresh().catch(() => {})
          return
        }
        const why = r.logs.filter((l) => l.startsWith('Program log: ')).map((l) => l.slice('Program log: '.length))
        const reason = `${of} refused: ${r.error}${why.length ? ` (${why.join('; ')})` : ''}`
        if (quiet) this.log({event: 'tick_refused', reason})
        else {
          this.log({event: 'rejected_by_program', of, code: r.error, reason})
          this.emit('rejected', reason, {code: r.error ?? 'refused', of} satisfies RejectionInfo)
        }
      })
      .catch((error: unknown) => {
        this.log({event: 'send_failed', of, message: errorMessage(error)})
        if (!quiet) this.emit('rejected', `${of} not sent: ${errorMessage(error)}`, {code: 'unreachable', of} satisfies RejectionInfo)
      })
      .finally(() => {
        this.busy--
        this.wakeIdle()
      })
    return true
  }

  /** Resolves once every queued transaction is sent and no read is in flight (tests step time with it). */
  async idle(): Promise<void> {
    while (this.busy > 0 || this.refreshing) await new Promise<void>((r) => this.idleWaiters.push(r))
  }

  private wakeIdle(): void {
    const waiters = this.idleWaiters
    this.idleWaiters = []
    for (const w of waiters) w()
  }

  /** Polls now (tests, and callers that know the chain changed). */
  async poll(): Promise<void> {
    await this.refresh()
    await this.maybeTick()
  }

  sendWitness(step: number, proof: WitnessProof): boolean {
    const {programId: p, signer} = this.opts
    return this.enqueue('witness', () =>
      witnessInstruction(p, this.coordinator, signer, step, Buffer.from(proof.participant_bloom, 'base64'), Buffer.from(proof.broadcast_bloom, 'base64')),
    )
  }

  sendWarmupReady(): boolean {
    return this.enqueue('warmup_witness', () => warmupWitnessInstruction(this.opts.programId, this.coordinator, this.opts.signer))
  }

  /** In batches of HEALTH_CHECK_BATCH accused, one transaction each: each accused costs ~34k compute units. */
  sendHealthCheck(_step: number, accused: ClientId[]): boolean {
    let sent = false
    for (let i = 0; i < accused.length; i += HEALTH_CHECK_BATCH) {
      const batch = accused.slice(i, i + HEALTH_CHECK_BATCH)
      sent = this.enqueue('health_check', () => healthCheckInstruction(this.opts.programId, this.coordinator, this.opts.signer, batch)) || sent
    }
    return sent
  }

  sendAccusation(step: number, accused: ClientId, reason: AccusationReason): boolean {
    return this.enqueue('accuse', () => accuseInstruction(this.opts.programId, this.coordinator, this.opts.signer, step, accused, reason))
  }

  /**
   * As a verifier of the round after `step`: our scores of its results (report_scores), each trainer addressed by its
   * index in round `step`'s roster (as the state we hold has it) and its score rounded once to fixed point
   * (scoreToFixed). The program keeps the moving averages that weigh each client's points (rewards.ts recordScores).
   * False when we no longer hold round `step` (the report would be stale).
   */
  sendScores(step: number, scores: {client_id: ClientId; score: number}[]): boolean {
    const s = this.state
    const scored = [s?.epoch.round, s?.epoch.previous_round].find((r) => r?.step === step)
    if (!scored) {
      this.log({event: 'scores_not_sent', step, reason: `round ${step} is no longer held (the state is at step ${s?.progress.step})`})
      return false
    }
    const entries = scores
      .filter((e) => scored.roster.includes(e.client_id))
      .slice(0, REPORT_SCORES_MAX)
      .map((e) => ({index: scored.roster.indexOf(e.client_id), score: scoreToFixed(e.score)}))
    return this.enqueue('report_scores', () => reportScoresInstruction(this.opts.programId, this.coordinator, this.opts.signer, step, entries))
  }

  private agreed: {data: Buffer; scores: Map<ClientId, {average: number; count: number; last_step: number}>} | undefined

  /** The scores the program keeps in the coordinator account's ledger (report_scores), as last read. */
  agreedScores(): ReadonlyMap<ClientId, {average: number; count: number; last_step: number}> {
    const data = this.lastData
    if (!data) return new Map()
    if (this.agreed?.data !== data) {
      let scores = new Map<ClientId, {average: number; count: number; last_step: number}>()
      try {
        scores = new Map(ledgerScores(decodeLedger(data)).map((r) => [r.client_id, {average: r.average, count: r.count, last_step: r.last_step}]))
      } catch (error) {
        this.log({event: 'coordinator_account_invalid', message: `rewards ledger: ${errorMessage(error)}`})
      }
      this.agreed = {data, scores}
    }
    return this.agreed.scores
  }

  /** Both signed announcements, verified by the Ed25519 program in the same transaction; the program ejects the producer. */
  sendEquivocation(proof: EquivocationProof): boolean {
    return this.enqueue('equivocation', () => equivocationInstructions(this.opts.programId, this.coordinator, this.opts.signer, proof))
  }

  sendWithdraw(): boolean {
    return this.enqueue('withdraw', () => withdrawInstruction(this.opts.programId, this.coordinator, this.opts.signer))
  }

  sendCooldownWitness(step: number, paramHash: string): boolean {
    return this.enqueue('hash_witness', () => hashWitnessInstruction(this.opts.programId, this.coordinator, this.opts.signer, step, paramHash))
  }

  sendCheckpoint(repo: HubRepo, paramHash?: string): boolean {
    return this.enqueue('checkpoint', () => checkpointInstruction(this.opts.programId, this.coordinator, this.opts.signer, repo, paramHash))
  }

  sendAddresses(p2pAddrs: string[]): boolean {
    if (p2pAddrs.length === 0) return false
    return this.enqueue('set_peer', () => this.setPeer(p2pAddrs))
  }

  /** Stops following the run (queued transactions are still sent first). */
  async close(): Promise<void> {
    if (this.closed) return
    await this.queue
    this.closed = true
    this.abort.abort()
    await this.loop?.catch(() => {})
    this.wakeIdle()
    this.emit('closed')
  }
}
