import assert from 'node:assert/strict'
import {AccountRole, type Address, type Instruction, type KeyPairSigner} from '@solana/kit'
import {readFileSync} from 'node:fs'
import {
  INSTRUCTION_UNITS,
  accuseInstruction,
  checkpointInstruction,
  coordinatorAddress,
  ejectInstruction,
  healthCheckInstruction,
  initCoordinatorInstructions,
  reportScoresInstruction,
  setPausedInstruction,
  signerMeta,
  updateInstruction,
  withUnits,
  witnessInstruction,
  withdrawInstruction,
} from '../../src/core/backend/solana/instructions.js'
import {COORDINATOR_PROGRAM_PATH, LocalChain, programPath, type ChainFeatures} from '../../src/core/backend/solana/local-chain.js'
import {IX, MAX_CLIENTS, STATE_SIZE, clientIdOf, decodeCoordinator, decodeLedger, encodeTag, type OnChainLedger} from '../../src/core/backend/solana/layout.js'
import {emptyLedger, FULL_WEIGHT_SCORE, observeTransition, recordScores, SCORE_ONE, type RewardsLedger} from '../../src/core/coordinator/rewards.js'
import {constant} from '../../src/core/layout/layout-table.js'
import {
  applyEvent,
  assignBatches,
  assignedTrainers,
  buildWitnessProof,
  clockEntropy,
  createCoordinator,
  isRoundPhase,
  selectVerifiers,
  verifierCount,
  trainerCount,
  selectWitnesses,
  serializeState,
  witnessBloomParams,
  type CoordinatorEvent,
  type CoordinatorState,
  type RejectionCode,
} from '../../src/core/coordinator/index.js'
import type {EquivocationProof} from '../../src/core/coordinator/equivocation.js'
import type {CheckpointConfig, CoordinatorConfig, HubRepo, LLMConfig} from '../../src/core/config/index.js'
import {innerSteps, validateRunConfig} from '../../src/core/config/run-config.js'
import {keypair, toInstruction, type Deployed} from './harness.js'
import {announce, sparseLoCo} from './vectors.js'

/**
 * Differential fuzzing of the on-chain coordinator against the TypeScript reference (src/core/coordinator): a seeded
 * PRNG draws a run (clients, configuration) and a sequence of events — joins, leaves, ejections, ticks at random
 * times, warmup reports and witness proofs (valid, partial, random, wrongly sized), health checks, accusations,
 * equivocation proofs, Cooldown's parameter-hash witnesses, checkpoints (with the agreed hash, another or none),
 * pause/resume, configuration updates (valid and not, with designated checkpointers) — and malformed instructions
 * (unknown, truncated or padded data, missing signatures, the wrong authority or account). Each event runs through
 * both; after every one the program must have accepted what the reference accepted, rejected with the reference's
 * code what it rejected, and hold the reference's state (decoded from the account and compared field by field, and
 * as the reference's serialization). A malformed instruction has no reference event: the program must refuse it (with
 * the exact code where the check precedes any rule) and change nothing.
 *
 * The one tolerated difference is capacity: the account holds MAX_CLIENTS clients and joiners, MAX_WITNESSES proofs
 * and MAX_ACCUSATIONS accusations a round, and the reference has no such bound. When the program answers
 * CapacityExceeded where the reference's next state is past one of those bounds, the sequence ends there.
 */

/** Parameter hashes a sequence's Cooldown witnesses and checkpoints declare: the honest one, and another. */
const FUZZ_PARAMS = ['a1'.repeat(32), 'e0'.repeat(32)] as const

/** sfc32: a small, fast, seedable PRNG (each sequence is reproducible from its seed alone). */
class Rng {
  private a: number
  private b: number
  private c: number
  private d: number

  constructor(seed: number) {
    this.a = 0x9e3779b9
    this.b = 0x243f6a88
    this.c = 0xb7e15162
    this.d = seed >>> 0
    for (let i = 0; i < 15; i++) this.next()
  }

  /** A uniform 32-bit unsigned integer. */
  next(): number {
    const t = (((this.a + this.b) | 0) + this.d) | 0
    this.d = (this.d + 1) | 0
    this.a = this.b ^ (this.b >>> 9)
    this.b = (this.c + (this.c << 3)) | 0
    this.c = (this.c << 21) | (this.c >>> 11)
    this.c = (this.c + t) | 0
    return t >>> 0
  }

  /** An integer in [lo, hi]. */
  int(lo: number, hi: number): number {
    return lo + (this.next() % (hi - lo + 1))
  }

  chance(p: number): boolean {
    return this.next() / 0x1_0000_0000 < p
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError('pick from an empty list')
    return items[this.next() % items.length]
  }

  /** A key of `weights`, drawn in proportion to its weight. */
  weighted<K extends string>(weights: Record<K, number>): K {
    const entries = Object.entries(weights) as [K, number][]
    let r = this.next() % entries.reduce((sum, [, w]) => sum + w, 0)
    for (const [k, w] of entries) {
      if (r < w) return k
      r -= w
    }
    return entries[0][0]
  }

  bytes(n: number): Buffer {
    return Buffer.from(Array.from({length: n}, () => this.next() & 0xff))
  }

  /** A random subset of `items` (each kept with probability p). */
  subset<T>(items: readonly T[], p = 0.5): T[] {
    return items.filter(() => this.chance(p))
  }
}

/** The pool of client keys the fuzzer draws from (keypair(`fuzz-${i}`)); at most MAX_CLIENTS + a few strangers. */
const POOL_SIZE = MAX_CLIENTS + 4
let poolCache: Promise<{signers: KeyPairSigner[]; ids: string[]; labels: string[]}> | undefined

function pool(): Promise<{signers: KeyPairSigner[]; ids: string[]; labels: string[]}> {
  poolCache ??= (async () => {
    const labels = Array.from({length: POOL_SIZE}, (_, i) => `fuzz-${i}`)
    const signers = await Promise.all(labels.map((l) => keypair(l)))
    return {signers, ids: signers.map((s) => clientIdOf(s.address)), labels}
  })()
  return poolCache
}

const baseLLM: LLMConfig = {
  architecture: 'HfLlama',
  data_type: 'Pretraining',
  max_seq_len: 16,
  cold_start_warmup_steps: 0,
  checkpoint: {Hub: {repo_id: 'org/model'}},
  data_location: {Server: '127.0.0.1:20001'},
  lr_schedule: {Constant: {base_lr: 1e-3, warmup_steps: 0, warmup_init_lr: 0}},
  optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
}

const REPO_CHARS = 'abcdefghijklmnopqrstuvwxyz0123456789-_./'

function text(rng: Rng, min: number, max: number): string {
  return Array.from({length: rng.int(min, max)}, () => rng.pick([...REPO_CHARS])).join('')
}

function randomRepo(rng: Rng, allowEmpty: boolean): HubRepo {
  const repo: HubRepo = {repo_id: allowEmpty && rng.chance(0.1) ? '' : rng.chance(0.1) ? text(rng, 90, 96) : text(rng, 1, 24)}
  if (rng.chance(0.5)) repo.revision = rng.chance(0.1) ? '' : rng.chance(0.1) ? text(rng, 60, 64) : text(rng, 1, 12)
  return repo
}

/** A run configuration: valid by construction for `clients` clients, or (with `invalid`) one field out of range. */
function randomConfig(rng: Rng, clients: number, invalid: boolean): CoordinatorConfig {
  const max_round_train_time = rng.int(1, 15)
  const round_witness_time = rng.int(1, 6)
  const min_clients = rng.int(1, Math.max(1, Math.min(clients, 4)))
  const start = rng.int(1, 16)
  const config: CoordinatorConfig = {
    warmup_time: rng.int(0, 12),
    cooldown_time: rng.int(1, 12),
    epoch_time: max_round_train_time + round_witness_time + rng.int(0, 60),
    max_round_train_time,
    round_witness_time,
    min_clients,
    init_min_clients: rng.int(min_clients, Math.max(min_clients, Math.min(clients + 1, 6))),
    witness_nodes: rng.pick([0, 0, 1, 1, 2, 3, rng.int(1, 40)]),
    verification_percent: rng.pick([0, 0, 0, 25, 50, 100]),
    global_batch_size_start: start,
    global_batch_size_end: rng.chance(0.7) ? start : rng.int(1, 24),
    global_batch_size_warmup_tokens: rng.chance(0.7) ? 0 : rng.int(1, 2000),
    total_steps: rng.int(1, 30),
    waiting_for_members_extra_time: rng.int(0, 5),
  }
  if (rng.chance(0.4)) config.rounds_per_epoch = rng.int(1, 6)
  // Drawn from a generator of its own, so that every other draw of a seed's sequence stays what it was.
  const side = new Rng(config.total_steps * 7919 + config.epoch_time * 131 + start)
  // G small (1 to 4) mostly; sometimes up to 12, so that pools of 7 to 16 draw G-sized blooms of several lengths.
  if (side.chance(0.35)) config.max_trainers_per_round = side.chance(0.7) ? side.int(1, 4) : side.int(5, 12)
  if (invalid) {
    const bad = config as unknown as Record<string, number>
    const field = rng.pick([
      'cooldown_time',
      'epoch_time',
      'max_round_train_time',
      'round_witness_time',
      'min_clients',
      'init_min_clients',
      'verification_percent',
      'global_batch_size_start',
      'global_batch_size_end',
      'total_steps',
      'rounds_per_epoch',
    ] as const)
    bad[field] = rng.pick([0, 101, 70_000, 5_000_000_000, 2 ** 40])
  }
  return config
}

function randomModel(rng: Rng, config: CoordinatorConfig): {LLM: LLMConfig} {
  const kind = rng.pick(['Hub', 'P2P', 'Dummy'] as const)
  const checkpoint = {[kind]: randomRepo(rng, true)} as CheckpointConfig
  const max_seq_len = rng.pick([1, 16, 64, rng.int(1, 4096)])
  const cold_start_warmup_steps = rng.chance(0.8) ? 0 : rng.int(0, config.total_steps + 2)
  // SparseLoCo's inner steps (each round H global batches), now and then out of range: drawn from a generator of its
  // own, so that every other draw of a seed's sequence stays what it was
  const side = new Rng(max_seq_len * 7919 + cold_start_warmup_steps * 131 + config.total_steps * 31 + (checkpoint as Record<string, HubRepo>)[kind].repo_id.length)
  const optimizer = side.chance(0.4) ? sparseLoCo(side.chance(0.05) ? side.pick([0, 10_001]) : side.pick([2, 3, 4, side.int(1, 40)])) : baseLLM.optimizer
  return {LLM: {...baseLLM, max_seq_len, cold_start_warmup_steps, checkpoint, optimizer}}
}

/** A program-only event: an instruction the reference has no event for, which the program must refuse. */
interface Malformed {
  type: 'malformed'
  what: string
  ix: Instruction
  signer: KeyPairSigner
  /** The exact code, where the program's check precedes every rule; otherwise any refusal will do. */
  code?: string
}

/**
 * A verifier's score report (report_scores; rewards.ts recordScores, which the reference ledger applies): the scored
 * step and fixed-point scores per trainer. The program addresses a trainer by its index in the scored round's roster;
 * a trainer in no such roster gets an index past it.
 */
interface ScoreReport {
  type: 'scores'
  from: string
  step: number
  scores: {client_id: string; score: number}[]
}

type Step = {event: CoordinatorEvent} | Malformed | ScoreReport

/** The program's error for each refusal of recordScores (the server's code for a stale step is stale_step). */
const SCORE_REFUSALS: Record<string, string> = {InvalidRunState: 'InvalidRunState', stale_step: 'WrongStep', InvalidScores: 'InvalidScores', DuplicateScores: 'DuplicateScores'}

/** One sequence's world: both coordinators, the chain, and who signs for whom. */
class Sequence {
  state: CoordinatorState
  now: number
  slot = 1000
  readonly log: string[] = []
  readonly signers = new Map<string, KeyPairSigner>()
  readonly members: string[]

  constructor(
    readonly rng: Rng,
    readonly d: Deployed,
    readonly runId: string,
    readonly ids: string[],
    readonly labels: Map<string, string>,
    config: CoordinatorConfig,
    model: {LLM: LLMConfig},
    createdAt: number,
  ) {
    this.now = createdAt
    this.members = ids
    this.state = createCoordinator({run_id: runId, run_state: 'Uninitialized', config, model}, {now: createdAt * 1000})
  }

  id(): string {
    return this.rng.pick(this.members)
  }

  /** A client of the epoch, most of the time (a random pool member otherwise). */
  client(): string {
    const clients = this.state.epoch.clients.map((c) => c.id)
    return clients.length > 0 && this.rng.chance(0.85) ? this.rng.pick(clients) : this.id()
  }

  signer(id: string): KeyPairSigner {
    const s = this.signers.get(id)
    if (!s) throw new Error(`no keypair for ${id}`)
    return s
  }

  /** Seconds to the next tick: none, one, up to a phase's length, or a long silence. */
  dt(): number {
    const c = this.state.config
    switch (this.rng.weighted({zero: 1, one: 4, phase: 3, long: 1})) {
      case 'zero':
        return 0
      case 'one':
        return 1
      case 'phase':
        return this.rng.int(1, Math.max(2, c.max_round_train_time, c.warmup_time, c.cooldown_time, c.waiting_for_members_extra_time) + 2)
      case 'long':
        return this.rng.int(30, 3000)
    }
  }

  /** Per round (epoch/step): whether one of its trainers is cut off from its peers (proof). */
  private readonly cutRounds = new Map<string, boolean>()

  proof(from: string): {participant_bloom: string; broadcast_bloom: string} {
    const round = this.state.epoch.round!
    const kind = this.rng.weighted({valid: 8, random: 1, size: 1})
    const size = witnessBloomParams(this.state.config, round).bits / 8
    if (kind === 'random') return {participant_bloom: this.rng.bytes(size).toString('base64'), broadcast_bloom: this.rng.bytes(size).toString('base64')}
    if (kind === 'size') {
      // (never 0 bytes: an empty proof is the warmup report, another instruction)
      // (and, with max_trainers_per_round below the roster, a bloom sized for the whole roster)
      const wide = witnessBloomParams({}, {roster: round.roster}).bits / 8
      const n = this.rng.pick([1, size - 1, size + 1, 80, wide].filter((x) => x >= 1 && x <= 80 && x !== size))
      return {participant_bloom: this.rng.bytes(n).toString('base64'), broadcast_bloom: this.rng.bytes(n).toString('base64')}
    }
    const trainers = [...assignBatches(this.state)].filter(([, r]) => r.end > r.start)
    const all = this.rng.chance(0.6)
    // In a third of the rounds a trainer is cut off from its peers (the round's first with batches): the other
    // witnesses saw everyone else, its own proof names only itself, which must not make it healthy (sim: "a client cut
    // off from its peers"; a bloom naming a trainer it never received made every replica wait for its result).
    const key = `${this.state.progress.epoch}/${round.step}`
    if (!this.cutRounds.has(key)) this.cutRounds.set(key, this.rng.chance(0.35))
    const cutoff = this.cutRounds.get(key) ? trainers[0]?.[0] : undefined
    const seen = trainers
      .filter(([id]) => (cutoff ? (from === cutoff ? id === cutoff : id !== cutoff) : all || this.rng.chance(0.6)))
      .map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 7)}))
    return buildWitnessProof(this.state.config, round, seen)
  }

  equivocationProof(): EquivocationProof {
    const producer = this.client()
    const label = this.labels.get(producer)!
    const step = this.state.epoch.round && this.rng.chance(0.8) ? this.state.epoch.round.step : this.rng.int(0, this.state.progress.step + 2)
    const variant = this.rng.weighted({valid: 6, same: 1, run: 1, step: 1})
    const run = variant === 'run' ? `${this.runId}x` : this.runId
    const a = announce(run, label, step, [0, 2], 1)
    const b = variant === 'same' ? announce(run, label, step, [0, 2], 1) : announce(run, label, variant === 'step' ? step + 1 : step, [0, 2], this.rng.int(2, 9))
    return {a, b}
  }

  /**
   * Cooldown's witness: mostly a witness of the epoch's last round attesting the honest hash; sometimes another hash, a
   * wrong step, or a client that is no witness (a parameter hash outside Cooldown is drawn rarely, and refused).
   */
  hashWitness(): CoordinatorEvent {
    const round = this.state.epoch.round!
    const witnesses = selectWitnesses(this.state, round)
    const from = witnesses.length > 0 && this.rng.chance(0.85) ? this.rng.pick(witnesses) : this.client()
    const step = this.rng.chance(0.9) ? round.step : round.step + this.rng.pick([-1, 1])
    const param_hash = this.rng.chance(0.8) ? FUZZ_PARAMS[0] : FUZZ_PARAMS[1]
    return {type: 'witness', from, step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash}
  }

  /** Draws the next event from the reference's state: mostly plausible ones, some wrong. */
  draw(): Step {
    const s = this.state
    const round = isRoundPhase(s.run_state) ? s.epoch.round : null
    const kind = this.rng.weighted({
      tick: 30,
      join: 12,
      withdraw: 4,
      eject: 2,
      witness: round ? 22 : s.run_state === 'Warmup' ? 30 : s.run_state === 'Cooldown' ? 40 : 2,
      health_check: round ? 6 : 1,
      accuse: round ? 6 : 1,
      equivocation: 2,
      // outside Cooldown: a late upload of the run's current model (once an epoch recorded its hash)
      checkpoint: s.run_state === 'Cooldown' ? 20 : s.current_model?.param_hash ? 8 : 1,
      pause: 2,
      resume: s.run_state === 'Paused' || s.run_state === 'Uninitialized' ? 6 : 1,
      config_update: s.run_state === 'Paused' || s.run_state === 'Uninitialized' ? 5 : 1,
      malformed: 6,
      scores: round && s.epoch.previous_round ? (verifierCount(s.config, round.roster.length) > 0 ? 30 : 6) : 1,
    })
    switch (kind) {
      case 'scores':
        return this.scoreReport()
      case 'tick':
        this.now += this.dt()
        return {event: {type: 'tick'}}
      case 'join': {
        const outside = this.members.filter((id) => !s.pending.includes(id) && !s.epoch.clients.some((c) => c.id === id))
        return {event: {type: 'join', id: outside.length > 0 && this.rng.chance(0.85) ? this.rng.pick(outside) : this.id()}}
      }
      case 'withdraw':
        return {event: {type: 'withdraw', id: this.rng.chance(0.3) && s.pending.length > 0 ? this.rng.pick(s.pending) : this.client()}}
      case 'eject':
        return {event: {type: 'eject', id: this.client()}}
      case 'witness': {
        if (s.run_state === 'Cooldown' && s.epoch.round) return {event: this.hashWitness()}
        if (s.run_state === 'Warmup' || !round) return {event: {type: 'witness', from: this.client(), step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}}}
        const witnesses = selectWitnesses(s)
        const from = witnesses.length > 0 && this.rng.chance(0.8) ? this.rng.pick(witnesses) : this.client()
        const step = this.rng.chance(0.9) ? round.step : round.step + this.rng.pick([-1, 1, 7])
        return {event: {type: 'witness', from, step, proof: this.proof(from)}}
      }
      case 'health_check': {
        const judged = s.epoch.previous_round?.roster ?? []
        const n = this.rng.pick([0, 1, 1, 1, 2, 3])
        const accused = Array.from({length: n}, () => (judged.length > 0 && this.rng.chance(0.85) ? this.rng.pick(judged) : this.id()))
        // often the judged round's first trainer (cut off from its peers in some rounds: proof)
        const previous = s.epoch.previous_round
        const cutoff = previous ? [...assignBatches(s, previous)].find(([, r]) => r.end > r.start)?.[0] : undefined
        if (cutoff && this.rng.chance(0.5)) accused.splice(0, 1, cutoff)
        return {event: {type: 'health_check', from: this.client(), accused}}
      }
      case 'accuse': {
        const byScore = this.rng.chance(0.4)
        const judges = round ? (byScore ? selectVerifiers(s) : selectWitnesses(s)) : []
        const from = judges.length > 0 && this.rng.chance(0.8) ? this.rng.pick(judges) : this.client()
        const roster = round?.roster ?? []
        // a low score: often one the seed assigned `from` to score (assignedTrainers), so quorums of them are reached
        const previous = s.epoch.previous_round
        const mine = byScore && round && previous ? assignedTrainers(s, round, previous, from) : []
        const accused = mine.length > 0 && this.rng.chance(0.7) ? this.rng.pick(mine) : roster.length > 0 && this.rng.chance(0.85) ? this.rng.pick(roster) : this.id()
        const step = round && this.rng.chance(0.9) ? round.step : this.rng.int(0, s.progress.step + 1)
        return {event: {type: 'accuse', from, step, accused, reason: byScore ? 'low_score' : 'invalid_result'}}
      }
      case 'equivocation':
        return {event: {type: 'equivocation', from: this.client(), proof: this.equivocationProof()}}
      case 'checkpoint': {
        // mostly the hash the honest witnesses attest, sometimes another or none
        const hash = this.rng.weighted({honest: 4, other: 4, none: 1})
        const param_hash = hash === 'honest' ? FUZZ_PARAMS[0] : hash === 'other' ? FUZZ_PARAMS[1] : undefined
        const members = s.epoch.clients.map((c) => c.id)
        // late, a designated checkpointer needs no membership: often one of the list
        const designated = s.config.checkpointers ?? []
        const from =
          s.run_state !== 'Cooldown' && designated.length > 0 && this.rng.chance(0.6)
            ? this.rng.pick(designated)
            : members.length > 0 && this.rng.chance(0.7)
              ? this.rng.pick(members)
              : this.client()
        return {event: {type: 'checkpoint', from, repo: randomRepo(this.rng, true), ...(param_hash ? {param_hash} : {})}}
      }
      case 'pause':
        return {event: {type: 'pause'}}
      case 'resume':
        return {event: {type: 'resume'}}
      case 'config_update': {
        const config = randomConfig(this.rng, this.members.length, this.rng.chance(0.2))
        // designated checkpointers: some of the clients (now and then one twice, which both refuse)
        if (this.rng.chance(0.4)) {
          const some = this.members.filter(() => this.rng.chance(0.5)).slice(0, this.rng.int(1, 8))
          config.checkpointers = some.length > 0 ? some : [this.client()]
          if (this.rng.chance(0.1)) config.checkpointers.push(config.checkpointers[0])
        }
        const which = this.rng.weighted({both: 3, config: 2, model: 2})
        return {
          event: {
            type: 'config_update',
            ...(which !== 'model' ? {config} : {}),
            ...(which !== 'config' ? {model: randomModel(this.rng, which === 'model' ? s.config : config)} : {}),
          },
        }
      }
      case 'malformed':
        return this.malformed()
    }
  }

  /**
   * A score report: mostly a verifier of the round scoring the previous round's results it was assigned (any subset, in
   * any order; scores anywhere in [-1, 1] or near FULL_WEIGHT_SCORE), sometimes from a non-verifier, of a stale step,
   * naming an unassigned trainer, itself, a stranger, a trainer twice, or a score out of range. The same verifier drawn
   * again reports a duplicate.
   */
  scoreReport(): ScoreReport {
    const s = this.state
    const round = isRoundPhase(s.run_state) ? s.epoch.round : null
    const previous = s.epoch.previous_round
    const verifiers = round ? selectVerifiers(s) : []
    const from = verifiers.length > 0 && this.rng.chance(0.85) ? this.rng.pick(verifiers) : this.client()
    const step = round && this.rng.chance(0.9) ? round.step - 1 : this.rng.int(0, s.progress.step + 1)
    const mine = round && previous && previous.step === round.step - 1 ? assignedTrainers(s, round, previous, from) : []
    const score = () =>
      this.rng.weighted({any: 3, near: 3, extreme: 1}) === 'any'
        ? this.rng.int(0, 2 * SCORE_ONE) - SCORE_ONE
        : this.rng.chance(0.5)
          ? this.rng.int(0, 2 * FULL_WEIGHT_SCORE)
          : this.rng.pick([SCORE_ONE, -SCORE_ONE, 0, 1, -1])
    const scores = mine.filter(() => this.rng.chance(0.8)).map((client_id) => ({client_id, score: score()}))
    const flaw = this.rng.weighted({none: 12, unassigned: 1, self: 1, stranger: 1, repeated: 2, range: 1})
    const roster = previous?.roster ?? []
    if (flaw === 'unassigned' && roster.length > 0) scores.push({client_id: this.rng.pick(roster), score: score()})
    if (flaw === 'self') scores.push({client_id: from, score: score()})
    if (flaw === 'stranger') scores.push({client_id: this.rng.pick(this.members), score: score()})
    if (flaw === 'repeated' && scores.length > 0) scores.splice(this.rng.int(0, scores.length), 0, {...this.rng.pick(scores), score: score()})
    if (flaw === 'range' && scores.length > 0) this.rng.pick(scores).score = this.rng.pick([SCORE_ONE + 1, -SCORE_ONE - 1, 2 ** 31 - 1])
    return {type: 'scores', from, step, scores}
  }

  /** An instruction the program must refuse whatever the state. */
  malformed(): Malformed {
    const {programId: p, coordinator: c, authority, payer} = this.d
    const client = this.signer(this.client())
    const kind = this.rng.weighted({unknown: 2, empty: 1, truncated: 3, padded: 3, unsigned: 2, stranger: 2, account: 2, readonly: 1, missing: 1, warmup: 1})
    const raw = (data: Uint8Array, accounts: Instruction['accounts'], units = 30_000): Instruction => withUnits({programAddress: p, accounts, data}, units)
    const signed = (data: Uint8Array) => raw(data, [signerMeta(client), {address: c, role: AccountRole.WRITABLE}])
    // A well-formed instruction to cut or pad (its data only matters for the length checks).
    const wellFormed = (): Instruction => {
      const round = this.state.epoch.round
      const size = witnessBloomParams(this.state.config, round ?? {roster: []}).bits / 8
      return this.rng.pick([
        // (in Warmup a witness instruction is a warmup report whatever its proof, as the reference's witness event)
        () => (this.state.run_state === 'Warmup' ? withdrawInstruction(p, c, client) : witnessInstruction(p, c, client, round?.step ?? 1, Buffer.alloc(size), Buffer.alloc(size))),
        () => healthCheckInstruction(p, c, client, [this.id()]),
        () => checkpointInstruction(p, c, client, randomRepo(this.rng, false)),
        () => accuseInstruction(p, c, client, round?.step ?? 1, this.id(), 'invalid_result'),
        () => ejectInstruction(p, c, authority, this.id()),
        () => setPausedInstruction(p, c, authority, this.rng.chance(0.5)),
        () => updateInstruction(p, c, authority, this.state.config, this.rng.chance(0.5) ? this.state.model : undefined),
        () => withdrawInstruction(p, c, client),
        () => raw(encodeTag(IX.join_run), [signerMeta(client), {address: c, role: AccountRole.WRITABLE}]),
        () => raw(encodeTag(IX.warmup_witness), [signerMeta(client), {address: c, role: AccountRole.WRITABLE}]),
        () => raw(encodeTag(IX.tick), [{address: c, role: AccountRole.WRITABLE}]),
      ])()
    }
    const signerOf = (ix: Instruction): KeyPairSigner => ((ix.accounts?.[0] as {signer?: KeyPairSigner} | undefined)?.signer ?? payer) as KeyPairSigner
    switch (kind) {
      case 'unknown': {
        const tag = this.rng.int(Math.max(...Object.values(IX)) + 1, 255)
        return {
          type: 'malformed',
          what: `unknown instruction ${tag}`,
          ix: signed(Buffer.concat([Buffer.from([tag]), this.rng.bytes(this.rng.int(0, 40))])),
          signer: client,
          code: 'InvalidInstruction',
        }
      }
      case 'empty':
        return {type: 'malformed', what: 'empty data', ix: signed(new Uint8Array()), signer: client, code: 'InvalidInstruction'}
      case 'truncated': {
        const ix = wellFormed()
        const data = ix.data!
        if (data.length < 2) return this.malformed()
        return {type: 'malformed', what: `truncated ${data[0]} (${data.length} → ?)`, ix: {...ix, data: data.slice(0, this.rng.int(1, data.length - 1))}, signer: signerOf(ix)}
      }
      case 'padded': {
        const ix = wellFormed()
        const pad = this.rng.bytes(this.rng.int(1, 9))
        return {
          type: 'malformed',
          what: `instruction ${ix.data![0]} with ${pad.length} trailing bytes`,
          ix: {...ix, data: Buffer.concat([Buffer.from(ix.data!), pad])},
          signer: signerOf(ix),
        }
      }
      case 'unsigned': {
        // accounts[0] is a client's (or the authority's) key that did not sign; the payer signs the transaction
        const who = this.rng.chance(0.5) ? authority : client
        const tag = this.rng.pick([IX.update, IX.set_paused, IX.join_run, IX.withdraw, IX.warmup_witness, IX.eject, IX.checkpoint])
        return {
          type: 'malformed',
          what: `instruction ${tag} without the signature of accounts[0]`,
          ix: raw(Buffer.from([tag]), [
            {address: who.address, role: AccountRole.READONLY},
            {address: c, role: AccountRole.WRITABLE},
          ]),
          signer: payer,
          code: 'MissingSignature',
        }
      }
      case 'stranger': {
        // the authority's instructions signed by someone else
        const make = this.rng.pick([
          () => setPausedInstruction(p, c, client, this.rng.chance(0.5)),
          () => ejectInstruction(p, c, client, this.id()),
          () => updateInstruction(p, c, client, this.state.config, this.state.model),
        ])
        return {type: 'malformed', what: 'an authority instruction signed by a client', ix: make(), signer: client, code: 'Unauthorized'}
      }
      case 'account': {
        // another account where the coordinator belongs: the payer's (system-owned)
        const ix = wellFormed()
        const at = ix.data![0] === IX.tick ? 0 : 1
        const accounts = ix.accounts!.map((a, i) => (i === at ? {address: payer.address, role: AccountRole.WRITABLE} : a))
        return {type: 'malformed', what: `instruction ${ix.data![0]} on a foreign account`, ix: {...ix, accounts}, signer: signerOf(ix), code: 'WrongAccount'}
      }
      case 'readonly': {
        const ix = wellFormed()
        const at = ix.data![0] === IX.tick ? 0 : 1
        const accounts = ix.accounts!.map((a, i) => (i === at ? {address: c, role: AccountRole.READONLY} : a))
        return {type: 'malformed', what: `instruction ${ix.data![0]} with a read-only coordinator`, ix: {...ix, accounts}, signer: signerOf(ix), code: 'NotWritable'}
      }
      case 'missing': {
        const tag = this.rng.pick([IX.join_run, IX.withdraw, IX.witness, IX.checkpoint, IX.update])
        return {
          type: 'malformed',
          what: `instruction ${tag} without the coordinator account`,
          ix: raw(Buffer.from([tag]), [signerMeta(client)]),
          signer: client,
          code: 'InvalidInstruction',
        }
      }
      case 'warmup':
        // warmup_witness outside Warmup: the reference's witness event has no such form (its proof is the round's)
        if (!isRoundPhase(this.state.run_state)) return this.malformed()
        return {
          type: 'malformed',
          what: 'warmup_witness during a round',
          ix: raw(encodeTag(IX.warmup_witness), [signerMeta(client), {address: c, role: AccountRole.WRITABLE}], INSTRUCTION_UNITS.warmup_witness),
          signer: client,
          code: 'InvalidRunState',
        }
    }
  }
}

const MAX_WITNESSES = constant('MAX_WITNESSES')
const MAX_ACCUSATIONS = constant('MAX_ACCUSATIONS')

/** The reference state's lists that are past the account's capacity (empty when none is). */
function overCapacity(s: CoordinatorState): string[] {
  const over: string[] = []
  if (s.pending.length + s.epoch.clients.length > MAX_CLIENTS) over.push(`clients and joiners ${s.pending.length + s.epoch.clients.length} > MAX_CLIENTS ${MAX_CLIENTS}`)
  if (s.epoch.exited.length > MAX_CLIENTS) over.push(`exited ${s.epoch.exited.length} > MAX_CLIENTS`)
  for (const r of [s.epoch.round, s.epoch.previous_round]) {
    if (!r) continue
    if (r.witnesses.length > MAX_WITNESSES) over.push(`witness proofs ${r.witnesses.length} > MAX_WITNESSES ${MAX_WITNESSES}`)
    if (r.accusations.length > MAX_ACCUSATIONS) over.push(`accusations ${r.accusations.length} > MAX_ACCUSATIONS ${MAX_ACCUSATIONS}`)
  }
  return over
}

export interface SequenceResult {
  seed: number
  events: number
  /** Events the program accepted (as the reference did). */
  accepted: number
  /** Events both rejected with the same code, by code (malformed instructions under 'malformed'). */
  rejected: Record<string, number>
  /** Phases the run passed through. */
  phases: Set<string>
  /** Set when the sequence ended on a capacity bound (the tolerated difference). */
  capacity?: string
  /** The most clients an epoch had. */
  maxClients: number
  /** The most compute units each kind of event used (the whole transaction, its budget instructions included). */
  units: Record<string, number>
  /** The rewards ledger at the end (the reference's, equal to the program's): results credited, points earned and slashed. */
  credited: number
  earned: number
  slashed: number
  /** Score reports both took, and clients holding a score at the end. */
  reports: number
  scored: number
  /** Checkpoints both took outside Cooldown (late uploads of the run's current model). */
  lateCheckpoints: number
  /** Warmups that ended with nobody loaded (no round), and trainers a closing round dropped. */
  abortedWarmups: number
  dropped: number
  /** Rounds begun with max_trainers_per_round below the roster (some members not chosen to train). */
  cappedRounds: number
  /** Rounds begun with SparseLoCo's inner steps above 1 (a round of H global batches). */
  innerStepRounds: number
}

class Divergence extends Error {
  constructor(
    message: string,
    /** The steps up to and including the diverging one. */
    readonly recorded: Recorded[],
  ) {
    super(message)
  }
}

/** The committed builds: sBPF v3 for a current cluster, v0 for a legacy one (the same C, linked for each). */
const PROGRAMS = {current: readFileSync(COORDINATOR_PROGRAM_PATH), legacy: readFileSync(programPath(COORDINATOR_PROGRAM_PATH, 'legacy'))}

/**
 * Runs the sequence of `seed`: a fresh chain and run, `length` events. Throws a Divergence naming the seed, the event
 * and the difference (with the sequence so far) when the program and the reference differ.
 */
/** One step as it ran: the clock, then the event or instruction. Replaying recorded steps reproduces a sequence. */
interface Recorded {
  now: number
  slot: number
  step: Step
}

interface SequenceOptions {
  length?: number
  maxClients?: number
  features?: ChainFeatures
  /** Runs these steps instead of drawing (the run, chain and clients are still the seed's). */
  replay?: Recorded[]
  /** Shrink a divergence to fewer events before reporting it (default: yes, unless replaying). */
  shrink?: boolean
  /** Tests of the fuzzer itself: a reference "bug" (the reference's next state, when this returns one). */
  fault?: (event: CoordinatorEvent, state: CoordinatorState) => CoordinatorState | undefined
}

/**
 * Shrinks a diverging sequence (delta debugging): drops chunks of steps, halving the chunk size when none can go, and
 * keeps any candidate that still diverges (in whatever way). Bounded to `budget` replays; returns the shortest found.
 */
async function shrink(seed: number, options: SequenceOptions, steps: Recorded[], budget = 150): Promise<{steps: Recorded[]; message?: string}> {
  let current = steps
  let message: string | undefined
  const diverges = async (candidate: Recorded[]): Promise<string | undefined> => {
    try {
      await runSequence(seed, {...options, replay: candidate, shrink: false})
      return undefined
    } catch (error) {
      return error instanceof Divergence ? error.message : undefined
    }
  }
  let chunks = 2
  while (current.length >= 2 && budget > 0) {
    const size = Math.ceil(current.length / chunks)
    let reduced = false
    for (let i = 0; i < current.length && budget > 0; i += size) {
      const candidate = [...current.slice(0, i), ...current.slice(i + size)]
      budget--
      const m = await diverges(candidate)
      if (m) {
        current = candidate
        message = m
        chunks = Math.max(chunks - 1, 2)
        reduced = true
        break
      }
    }
    if (!reduced) {
      if (chunks >= current.length) break
      chunks = Math.min(current.length, chunks * 2)
    }
  }
  return {steps: current, message}
}

export async function runSequence(seed: number, options: SequenceOptions = {}): Promise<SequenceResult> {
  try {
    return await runSteps(seed, options)
  } catch (error) {
    if (!(error instanceof Divergence) || options.replay || options.shrink === false) throw error
    const shrunk = await shrink(seed, options, error.recorded)
    if (!shrunk.message || shrunk.steps.length >= error.recorded.length) throw error
    throw new Divergence(`${error.message}\n\nshrunk to ${shrunk.steps.length} of ${error.recorded.length} events, still diverging:\n${shrunk.message}`, shrunk.steps)
  }
}

async function runSteps(seed: number, options: SequenceOptions): Promise<SequenceResult> {
  const features = options.features ?? 'current'
  const rng = new Rng(seed)
  const {signers, ids, labels} = await pool()
  const poolSize = Math.min(
    ids.length,
    rng.weighted({few: 10, some: 4, many: 1}) === 'few' ? rng.int(1, 6) : rng.chance(0.8) ? rng.int(7, 16) : (options.maxClients ?? MAX_CLIENTS) + rng.int(0, 4),
  )
  const chosen = ids.slice(0, poolSize)
  const runId = `fuzz-${seed.toString(36)}`.slice(0, 32)
  const createdAt = 1_700_000_000 + rng.int(0, 1_000_000)
  const programId = (await keypair('program')).address
  const chain = new LocalChain(programId, PROGRAMS[features], features)
  const payer = await keypair('payer')
  const authority = await keypair('authority')
  chain.airdrop(payer.address)
  chain.airdrop(authority.address)
  chain.setClock(createdAt, 999)
  const coordinator = await coordinatorAddress(programId, runId)
  const init = await chain.send(
    payer,
    initCoordinatorInstructions({
      programId,
      coordinator,
      payer,
      runId,
      mainAuthority: authority.address,
      joinAuthority: null,
      authorizer: programId,
      lamports: chain.rentExemption(STATE_SIZE),
    }),
  )
  if (!init.ok) throw new Error(`seed ${seed}: init_coordinator failed: ${init.error}`)
  const d: Deployed = {chain, programId: programId as Address, coordinator, payer, authority, authorizer: programId}
  let config = randomConfig(rng, poolSize, false)
  let model = randomModel(rng, config)
  // The reference's run starts configured; the program gets the same configuration by its first update.
  for (let i = 0; 'issues' in validateRunConfig(config, model); i++) {
    if (i > 100) throw new Error(`seed ${seed}: no valid configuration drawn`)
    config = randomConfig(rng, poolSize, false)
    model = randomModel(rng, config)
  }
  const seq = new Sequence(rng, d, runId, chosen, new Map(chosen.map((id, i) => [id, labels[i]])), config, model, createdAt)
  for (let i = 0; i < poolSize; i++) {
    seq.signers.set(ids[i], signers[i])
    chain.airdrop(signers[i].address)
  }
  const setup = await chain.send(authority, [updateInstruction(programId, coordinator, authority, config, model)])
  if (!setup.ok) throw new Error(`seed ${seed}: the first update failed: ${setup.error}\n${setup.logs.join('\n')}`)

  // A crowd: with a large pool, most sequences first have every member join and the run resume, so the epochs that
  // follow run at (and past) the account's capacity.
  const crowd: Step[] = poolSize > 16 && rng.chance(0.7) ? [...chosen.map((id): Step => ({event: {type: 'join', id}})), {event: {type: 'resume'}}] : []
  const replay = options.replay?.slice()
  const length = replay?.length ?? crowd.length + (options.length ?? rng.int(20, 120))
  const recorded: Recorded[] = []
  const result: SequenceResult = {
    seed,
    events: 0,
    accepted: 0,
    rejected: {},
    phases: new Set([seq.state.run_state]),
    maxClients: 0,
    units: {},
    credited: 0,
    earned: 0,
    slashed: 0,
    reports: 0,
    lateCheckpoints: 0,
    abortedWarmups: 0,
    dropped: 0,
    scored: 0,
    cappedRounds: 0,
    innerStepRounds: 0,
  }
  // The rewards ledger (rewards.ts) follows the reference's transitions; the program's must hold the same points.
  let ledger = emptyLedger()
  const fail = (i: number, what: string, message: string, logs: string[] = []): never => {
    throw new Divergence(
      `differential fuzz: seed ${seed}, event ${i} (${what} at ${seq.now}, ${seq.state.run_state}): ${message}\n` +
        (replay
          ? ''
          : `reproduce: PSYCHE_FUZZ_SEED=${seed}${features === 'legacy' ? ' PSYCHE_FUZZ_FEATURES=legacy' : ''} node --import tsx --test test/solana/differential.test.ts\n`) +
        `program logs:\n  ${logs.join('\n  ')}\nsequence${replay ? '' : ' so far'}:\n  ${seq.log.slice(replay ? 0 : -25).join('\n  ')}`,
      recorded,
    )
  }
  for (let i = 0; i < length; i++) {
    let step: Step
    if (replay) {
      const next = replay.shift()!
      ;[seq.now, seq.slot, step] = [next.now, next.slot, next.step]
    } else {
      step = crowd.shift() ?? seq.draw()
      seq.slot += rng.int(1, 3)
    }
    recorded.push({now: seq.now, slot: seq.slot, step})
    chain.setClock(seq.now, seq.slot)
    let expected: {error?: RejectionCode | string; message?: string; state: CoordinatorState; anyError?: boolean}
    let sent: {signer: KeyPairSigner; ix: Instruction | Instruction[]}
    let what: string
    let scored: RewardsLedger | undefined
    if ('type' in step && step.type === 'malformed') {
      what = `malformed: ${step.what}`
      expected = {state: seq.state, error: step.code, anyError: step.code === undefined}
      sent = {signer: step.signer, ix: step.ix}
    } else if ('type' in step && step.type === 'scores') {
      what = `scores ${step.from.slice(0, 6)} step ${step.step} [${step.scores.map((e) => `${e.client_id.slice(0, 6)}:${e.score}`).join(' ')}]`
      const out = recordScores(ledger, seq.state, step.from, step.step, step.scores)
      if ('code' in out) expected = {state: seq.state, error: SCORE_REFUSALS[out.code], message: out.reason}
      else [expected, scored] = [{state: seq.state}, out]
      const roster = seq.state.epoch.previous_round?.roster ?? []
      const entries = step.scores.map((e) => ({index: roster.includes(e.client_id) ? roster.indexOf(e.client_id) : roster.length + 3, score: e.score}))
      sent = {signer: seq.signer(step.from), ix: reportScoresInstruction(d.programId, coordinator, seq.signer(step.from), step.step, entries)}
    } else {
      let event = (step as {event: CoordinatorEvent}).event
      if (event.type === 'tick' || event.type === 'witness') event = {...event, entropy: clockEntropy(seq.slot, seq.now)}
      what = describe(event)
      const r = applyEvent(seq.state, event, seq.now * 1000)
      expected = {state: options.fault?.(event, r.state) ?? r.state, error: r.error?.code, message: r.error?.message}
      try {
        sent = toInstruction(d, seq.signers, event)
      } catch (error) {
        // what the client's builders refuse to encode (a repo id past REPO_MAX, ...) never reaches the program
        if (!(error instanceof RangeError)) throw error
        if (!expected.error) fail(i, what, `the reference accepts what the instruction builders refuse: ${(error as Error).message}`)
        seq.log.push(`${i} ${what} → not encodable (${(error as Error).message}); reference: ${expected.error}`)
        continue
      }
    }
    const r = await chain.send(sent.signer, Array.isArray(sent.ix) ? sent.ix : [sent.ix])
    result.events++
    const kind = what.split(/[ :]/)[0]
    result.units[kind] = Math.max(result.units[kind] ?? 0, Number(r.computeUnits))
    seq.log.push(`${i} t=${seq.now} ${what} → reference ${expected.anyError ? 'refuses' : (expected.error ?? 'ok')}, program ${r.ok ? 'ok' : r.error}`)
    if (r.ok) {
      if (expected.error || expected.anyError)
        fail(i, what, `the reference rejects with ${expected.error ?? 'some error'} (${expected.message ?? ''}); the program accepted`, r.logs)
      result.accepted++
      if (scored) result.reports++
      if (what.startsWith('checkpoint') && seq.state.run_state !== 'Cooldown') result.lateCheckpoints++
    } else if (!expected.error && !expected.anyError) {
      const over = overCapacity(expected.state)
      if (r.error === 'CapacityExceeded' && over.length > 0) {
        result.capacity = over.join(', ')
        break
      }
      fail(i, what, `the reference accepts; the program: ${r.error}`, r.logs)
    } else if (expected.error && r.error !== expected.error) {
      fail(i, what, `the reference rejects with ${expected.error} (${expected.message}); the program with ${r.error}`, r.logs)
    } else {
      const key = expected.anyError ? 'malformed' : expected.error!
      result.rejected[key] = (result.rejected[key] ?? 0) + 1
    }
    ledger = scored ?? observeTransition(ledger, seq.state, expected.state)
    if (seq.state.run_state === 'Warmup' && expected.state.run_state === 'WaitingForMembers' && seq.state.epoch.warmup_witnesses.length === 0) result.abortedWarmups++
    if (seq.state.run_state === 'RoundWitness' && expected.state.run_state !== 'RoundWitness')
      result.dropped += expected.state.epoch.exited.filter((c) => c.state === 'Dropped' && seq.state.epoch.clients.some((e) => e.id === c.id && e.state === 'Healthy')).length
    const begun = expected.state.epoch.round
    if (begun && begun !== seq.state.epoch.round && trainerCount(expected.state.config, begun.roster.length) < begun.roster.length) result.cappedRounds++
    if (begun && begun !== seq.state.epoch.round && innerSteps(expected.state.model.LLM.optimizer) > 1) result.innerStepRounds++
    seq.state = expected.state
    result.phases.add(seq.state.run_state)
    result.maxClients = Math.max(result.maxClients, seq.state.epoch.clients.length)
    const data = chain.accountData(coordinator)
    if (!data) fail(i, what, 'the coordinator account is gone')
    let onChain: CoordinatorState
    try {
      onChain = decodeCoordinator(data!).state
    } catch (error) {
      fail(i, what, `the account does not decode: ${(error as Error).message}`)
    }
    try {
      assert.deepStrictEqual(onChain!, seq.state)
      assert.equal(canonical(onChain!), canonical(seq.state))
    } catch (error) {
      fail(i, what, `states differ: ${(error as Error).message}`, r.logs)
    }
    const points = ledgerDifference(ledger, decodeLedger(data!))
    if (points) fail(i, what, `rewards ledgers differ: ${points}`, r.logs)
  }
  for (const e of Object.values(ledger.clients)) {
    result.credited += e.rounds + e.epoch_rounds
    result.earned += e.earned
    result.slashed += e.slashed
    if (e.score !== null) result.scored++
  }
  return result
}

/**
 * What differs between the reference's rewards ledger and the program's: every entry that holds something (results,
 * points or a score) must be in both with the same counts and the same fixed-point scores. The program also keeps
 * entries of clients that joined and hold nothing (the reference drops those).
 */
export function ledgerDifference(ts: RewardsLedger, chain: OnChainLedger): string | undefined {
  const fields = ['rounds', 'batches', 'epoch_rounds', 'epoch_batches', 'earned', 'slashed'] as const
  const holds = (e: Record<(typeof fields)[number], number>) => fields.some((f) => e[f] !== 0)
  const onChain = new Map<string, OnChainLedger['entries'][number]>()
  for (const e of chain.entries) {
    if (onChain.has(e.client_id)) return `${e.client_id.slice(0, 8)} has two entries in the program's ledger`
    onChain.set(e.client_id, e)
  }
  for (const e of chain.entries) if (holds(e) && !ts.clients[e.client_id]) return `the program credits ${e.client_id.slice(0, 8)} ${JSON.stringify(e)}, the reference nothing`
  for (const e of chain.entries)
    if (e.score !== null && ts.clients[e.client_id]?.score == null) return `the program keeps a score of ${e.client_id.slice(0, 8)} ${JSON.stringify(e)}, the reference none`
  const scores = ['score', 'last', 'last_step', 'verifiers', 'count'] as const
  for (const e of Object.values(ts.clients)) {
    if (!holds(e) && e.score === null) continue
    const c = onChain.get(e.client_id)
    if (!c) return `the reference credits or scores ${e.client_id.slice(0, 8)}, the program has no entry`
    for (const f of fields) if (c[f] !== e[f]) return `${e.client_id.slice(0, 8)}.${f}: reference ${e[f]}, program ${c[f]}`
    if (e.score !== null) for (const f of scores) if (c[f] !== e[f]) return `${e.client_id.slice(0, 8)}.${f}: reference ${e[f]}, program ${c[f]}`
  }
  return undefined
}

/** The reference's serialization with keys in a canonical order (the order of an object's keys means nothing). */
function canonical(state: CoordinatorState): string {
  const sorted = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(sorted)
      : v !== null && typeof v === 'object'
        ? Object.fromEntries(
            Object.keys(v)
              .sort()
              .map((k) => [k, sorted((v as Record<string, unknown>)[k])]),
          )
        : v
  return JSON.stringify(sorted(JSON.parse(serializeState(state))))
}

function describe(e: CoordinatorEvent): string {
  const short = (id: string) => id.slice(0, 6)
  switch (e.type) {
    case 'join':
    case 'withdraw':
    case 'eject':
      return `${e.type} ${short(e.id)}`
    case 'witness':
      return `witness ${short(e.from)} step ${e.step} (${Buffer.from(e.proof.participant_bloom, 'base64').length} bytes)`
    case 'health_check':
      return `health_check ${short(e.from)} [${e.accused.map(short).join(' ')}]`
    case 'accuse':
      return `accuse ${short(e.from)} → ${short(e.accused)} step ${e.step} ${e.reason}`
    case 'equivocation':
      return `equivocation ${short(e.from)} → ${short(e.proof.a.client_id)} steps ${e.proof.a.step}/${e.proof.b.step}`
    case 'checkpoint':
      return `checkpoint ${short(e.from)} ${JSON.stringify(e.repo)}`
    case 'config_update':
      return `config_update${e.config ? ' config' : ''}${e.model ? ' model' : ''}`
    default:
      return e.type
  }
}

/** Asserts the sequences exercised what they are for: every phase, accepted events, and the reference's rejections. */
export function summarize(results: SequenceResult[], options: {fullRun?: boolean} = {}): void {
  const phases = new Set(results.flatMap((r) => [...r.phases]))
  const rejected: Record<string, number> = {}
  for (const r of results) for (const [k, n] of Object.entries(r.rejected)) rejected[k] = (rejected[k] ?? 0) + n
  const events = results.reduce((n, r) => n + r.events, 0)
  const accepted = results.reduce((n, r) => n + r.accepted, 0)
  const capacity = results.filter((r) => r.capacity).length
  const maxClients = Math.max(...results.map((r) => r.maxClients))
  const units: Record<string, number> = {}
  for (const r of results) for (const [k, n] of Object.entries(r.units)) units[k] = Math.max(units[k] ?? 0, n)
  console.log(`# most compute units per event: ${JSON.stringify(units)}`)
  console.log(
    `# ${results.length} sequences, ${events} events: ${accepted} accepted, rejected ${JSON.stringify(rejected)}, ${capacity} ended at a capacity bound, at most ${maxClients} clients in an epoch`,
  )
  for (const phase of ['WaitingForMembers', 'Warmup', 'RoundTrain', 'RoundWitness', 'Cooldown', 'Paused', 'Finished']) assert.ok(phases.has(phase), `no sequence reached ${phase}`)
  for (const code of ['Halted', 'InvalidRunState', 'AlreadyJoined', 'InvalidWitness', 'WrongStep', 'InvalidConfig', 'HashNotAgreed', 'CheckpointHashMismatch', 'malformed'])
    assert.ok((rejected[code] ?? 0) > 0, `no event was rejected with ${code}`)
  assert.ok(accepted > events / 4, `only ${accepted} of ${events} events were accepted`)
  const credited = results.reduce((n, r) => n + r.credited, 0)
  const earned = results.reduce((n, r) => n + r.earned, 0)
  console.log(`# rewards: ${credited} accepted results credited, ${earned} points earned, ${results.reduce((n, r) => n + r.slashed, 0)} slashed (program = reference)`)
  assert.ok(credited > 0 && earned > 0, 'no sequence credited an accepted result and settled its points')
  const reports = results.reduce((n, r) => n + r.reports, 0)
  console.log(`# scores: ${reports} reports taken, ${results.reduce((n, r) => n + r.scored, 0)} clients scored at the end (program = reference)`)
  assert.ok(reports > 0, 'no sequence had a score report taken')
  const [late, aborted, dropped] = (['lateCheckpoints', 'abortedWarmups', 'dropped'] as const).map((k) => results.reduce((n, r) => n + r[k], 0))
  console.log(`# the run's model: ${late} late checkpoints taken, ${aborted} Warmups ended with nothing loaded; ${dropped} unseen trainers dropped by a closing round`)
  assert.ok(late > 0 && aborted > 0 && dropped > 0, 'no sequence took a late checkpoint, ended a Warmup with nothing loaded, or dropped an unseen trainer')
  const capped = results.reduce((n, r) => n + r.cappedRounds, 0)
  console.log(`# max_trainers_per_round: ${capped} rounds began with fewer trainers than members`)
  assert.ok(capped > 0, 'no round began with max_trainers_per_round below its roster')
  const inner = results.reduce((n, r) => n + r.innerStepRounds, 0)
  console.log(`# SparseLoCo: ${inner} rounds began with inner_steps > 1 (H global batches a round)`)
  assert.ok(inner > 0, 'no round began with inner_steps > 1')
  if (options.fullRun) for (const code of ['InvalidScores', 'DuplicateScores']) assert.ok((rejected[code] ?? 0) > 0, `no score report was rejected with ${code}`)
  if (options.fullRun) assert.equal(maxClients, MAX_CLIENTS, `no sequence filled an epoch with MAX_CLIENTS = ${MAX_CLIENTS} clients`)
}
