import type {CoordinatorBackend} from '../backend/types.js'
import type {ClientId, CoordinatorState} from '../coordinator/index.js'
import type {EventLog} from '../events.js'
import type {ModelSnapshot} from '../p2p/index.js'
import type {ResultFormat} from '../verify/result.js'
import type {Frame} from '../worker/client.js'
import type {ClientComponents, ClientWorker} from './components.js'
import {StepLedger} from './ledger.js'
import type {ClientOptions} from './options.js'

/**
 * What the client's phases share (model loading, round results, verification, training, checkpointing,
 * evaluation, exchange health): the run's state as last pushed, our model's position, the per-step ledger. The
 * runner owns it and hands it to each phase; a phase changes only what its job is about.
 */
export class ClientContext {
  readonly id: ClientId
  readonly log: EventLog
  readonly p2p: ClientComponents['p2p']
  readonly data: ClientComponents['data']
  readonly clock: ClientComponents['clock']
  /** Per-step memory (results, training, witness and health-check sends...), pruned as rounds are applied. */
  readonly ledger = new StepLedger()
  /** `${step}:${producer}` (and `…:low_score`) of the accusations sent. */
  readonly accused = new Set<string>()
  /** The coordinator connection (replaced when we join again). */
  conn!: CoordinatorBackend
  /** The coordinator's state as last pushed. */
  state!: CoordinatorState
  /** The worker (replaced when one dies and ClientOptions.workerRestarts allows). */
  worker: ClientWorker
  /** The step our model is at (null: no model, or dropped until the next epoch). */
  modelStep: number | null = null
  trainedStep = 0
  lastHash: string | null = null
  roundsApplied = 0
  /** Speculative rounds (training.ts speculate) whose work the real round used, and those undone. */
  readonly speculation = {used: 0, discarded: 0}
  /** What we serve to joining clients: the model after the last applied round of an epoch (or as loaded). */
  snapshot: ModelSnapshot | undefined
  /** How the loaded model's results are laid out (the worker's configure reply); what intake checks bytes against. */
  resultFormat: ResultFormat | undefined
  stopped = false

  constructor(
    readonly opts: ClientOptions,
    readonly components: ClientComponents,
    /** Sends the coordinator messages decide.ts says are due. */
    readonly flushMessages: () => void,
    /** Wakes the work loop (something it waits for may have arrived). */
    readonly poke: () => void,
  ) {
    this.id = opts.id
    this.log = opts.log
    ;({worker: this.worker, p2p: this.p2p, data: this.data, clock: this.clock} = components)
  }
}

/** A worker's exported parameters as the snapshot we serve for `step`. */
export function snapshotOf(step: number, exported: {frames: Frame[]; paramHash: string}): ModelSnapshot {
  return {step, paramHash: exported.paramHash, frames: exported.frames.map((f) => ({name: f.name!, dtype: f.dtype, shape: f.shape, data: f.data as Uint8Array}))}
}
