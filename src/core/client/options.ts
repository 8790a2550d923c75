import type {ClientId} from '../coordinator/index.js'
import type {EventLog} from '../events.js'
import type {TrainPlan} from '../train/plan.js'
import type {EvalSettings} from './eval.js'

/** What a client trains with: the resolved plan's model, data and worker settings; LR and optimizer come from the run. */
export type ClientPlan = Pick<TrainPlan, 'model' | 'seqLen' | 'microBatch' | 'optimizer'>

export interface ClientOptions {
  /** This client's identity id (the key its P2P layer signs with and the coordinator knows it by). */
  id: ClientId
  runId: string
  plan: ClientPlan
  /** Model init: every first-epoch client must use the same (seedForRun). */
  seed: number
  /** Structured events, one object per line in --json mode. */
  log: EventLog
  /** How long an apply waits for a witnessed result it has no announcement of before applying without it. */
  missingResultWaitMs?: number
  /**
   * join --checkpoint-dir: after each epoch the model is saved in a directory `step-S` here (Hugging Face layout with
   * psyche-checkpoint.json), of which the last `keepCheckpoints` (default 3) are kept.
   */
  checkpointDir?: string
  keepCheckpoints?: number
  /** Relays (multiaddrs) to reserve a slot on besides the coordinator's; `relay: false` uses none. */
  relays?: string[]
  relay?: boolean
  /**
   * The Hugging Face Hub: where a `Hub` checkpoint the coordinator names is downloaded from, and — with `repo` —
   * where this client, as a checkpointer (Psyche's `--hub-repo`), uploads the model after each epoch.
   */
  hub?: {url?: string; token?: string; cacheDir?: string; repo?: string; revision?: string; stagingDir?: string; maxShardBytes?: number}
  /**
   * How many times a worker that died is replaced by a new one (components.restartWorker) before the client gives
   * up (default 0: a dead worker withdraws the client and ends it). A replaced worker has lost the model: the
   * client leaves the epoch and rejoins at the next one with the model from its peers.
   */
  workerRestarts?: number
  /**
   * Leave the run (withdraw; run() rejects with code ENOEXCHANGE) after this many applied rounds in a row in which
   * others trained and none of their results reached us; absent or 0: never (the warnings only).
   */
  maxRoundsWithoutExchange?: number
  /** Validation loss on held-out samples after every `every`-th round (eval.ts); absent or every 0: none. */
  eval?: EvalSettings
  /**
   * Begin the next round's compute on its predicted batches as soon as this round's result is out (decide.ts
   * `speculate`; default true when the worker can undo it). false: only once the round begins, as before.
   */
  speculate?: boolean
}

export interface ClientSummary {
  rounds: number
  lastStep: number | null
  paramHash: string | null
  bytesIn: number
  bytesOut: number
}
