/**
 * Psyche's run configuration, typed in the TOML's own shape: snake_case fields, and serde's
 * externally tagged enums as single-key objects (`{Cosine: {...}}`) or, for variants without data,
 * bare strings (`"Dummy"`, `"Ephemeral"`). A file written by Psyche's authors loads unchanged.
 */

import type {RUN_STATES} from '../layout/layout-table.js'

/** The coordinator's phases (the Psyche book's run states; listed in layout/layout-table.ts). */
export type RunState = (typeof RUN_STATES)[number]

/**
 * The `[config]` table: timings (seconds), client thresholds, batch sizes, run length. Psyche's timings are
 * integer seconds; ours may also be fractions with millisecond precision (e.g. round_witness_time = 0.5).
 */
export interface CoordinatorConfig {
  /** Time to let clients download and load the model before the first round of an epoch. */
  warmup_time: number
  /** Time at the end of an epoch to save the model and opt into the next epoch. */
  cooldown_time: number
  /** Length of an epoch in seconds, counted from the start of its Warmup. */
  epoch_time: number
  /** Newer Psyche files cap an epoch by rounds instead of (here: as well as) by time. Optional. */
  rounds_per_epoch?: number
  max_round_train_time: number
  /** Upper bound of the witness window; it closes as soon as every witness attested every trainer's result. */
  round_witness_time: number
  /** Below this many clients an epoch ends. */
  min_clients: number
  /** This many pending clients start an epoch; ≥ min_clients. */
  init_min_clients: number
  /** Witnesses per round; 0 = automatic (every client, up to 32). */
  witness_nodes: number
  verification_percent: number
  /**
   * The most results each verifier scores per round (our extension; default 4, at most 64): the round's seed assigns
   * them (coordinator/rules.ts assignedTrainers), so a verifier's scoring cost stays bounded as the run grows.
   */
  verification_sample?: number
  /**
   * At most this many members train each round (our extension; absent: all of them). The round's seed chooses them, as
   * it chooses witnesses; the others verify, witness and serve. A client then downloads at most this many results a
   * round, whatever the run's size: less compute per round, bounded bandwidth per client.
   */
  max_trainers_per_round?: number
  global_batch_size_start: number
  global_batch_size_end: number
  /** The global batch grows linearly from start to end over this many tokens; 0 = no ramp. */
  global_batch_size_warmup_tokens: number
  total_steps: number
  /** Extra seconds WaitingForMembers lasts at least, so more clients can join once enough are there. */
  waiting_for_members_extra_time: number
  /**
   * The run's designated checkpointers (Psyche's design: "a client or a set of clients are designated as the
   * checkpointers"): the client ids whose checkpoint reports the coordinator takes. Our extension; when absent, any
   * client of the epoch may report one (what Psyche's coordinator does, and the Solana program still does).
   */
  checkpointers?: string[]
}

export interface HubRepo {
  repo_id: string
  revision?: string
}

export interface GcsRepo {
  bucket: string
  prefix?: string
}

/**
 * Where clients get the model. `Local` is our extension (not Psyche's): a model directory in Hugging
 * Face layout on local disk, relative paths resolving against the config file's directory.
 */
export type CheckpointConfig = 'Ephemeral' | {Dummy: HubRepo} | {Hub: HubRepo} | {P2P: HubRepo} | {Gcs: GcsRepo} | {P2PGcs: GcsRepo} | {Local: {path: string}}

export type TokenSize = 'TwoBytes' | 'FourBytes'
export type Shuffle = 'DontShuffle' | {Seeded: number[]}

export type HttpLocation =
  | {SingleUrl: string}
  | {NumberedFiles: {url_template: string; start_index: number; n_left_pad_zeros: number; num_files: number}}
  | {Gcp: {bucket_name: string; filter_directory: string}}

export interface HttpDataLocation {
  location: HttpLocation
  token_size_in_bytes: TokenSize
  shuffle: Shuffle
}

/** Where the training tokens come from. A relative `Local` path resolves against the config file's directory (our extension). */
export type DataLocation = 'Dummy' | {Server: string} | {Local: string} | {Http: HttpDataLocation} | {WeightedHttp: string} | {Preprocessed: string}

export interface ConstantLr {
  base_lr: number
  warmup_steps: number
  warmup_init_lr: number
}

export interface LinearLr extends ConstantLr {
  total_steps: number
  final_lr: number
}

export type CosineLr = LinearLr

export interface WarmupStableDecayLr extends ConstantLr {
  stable_steps: number
  cosine_decay_steps: number
  cosine_decay_final_lr: number
  linear_decay_steps: number
  linear_decay_final_lr: number
}

export type LrSchedule = {Constant: ConstantLr} | {Linear: LinearLr} | {Cosine: CosineLr} | {WarmupStableDecay: WarmupStableDecayLr}

export interface AdamWConfig {
  betas: [number, number]
  weight_decay: number
  eps: number
  clip_grad_norm?: number
}

export interface DistroConfig {
  clip_grad_norm?: number
  weight_decay?: number
  compression_decay: number
  compression_chunk: number
  compression_topk: number
  quantize_1bit: boolean
}

/**
 * SparseLoCo (arXiv 2508.15706, τemplar's algorithm): our extension of Psyche's optimizer variants. A round is
 * `inner_steps` inner AdamW steps (`inner`, at the run's lr_schedule counted in inner steps) on the client's batches,
 * then a chunk-wise top-k of the error-feedback pseudo-gradient quantized to `value_bits`, and an outer step at
 * `outer_lr` from every accepted contribution (python/psyche_worker/optim/sparseloco.py).
 */
export interface SparseLoCoConfig {
  /** H: inner steps per round; a round's batch is H times the global batch (coordinator/rules.ts). */
  inner_steps: number
  /** β of the error feedback e ← β·e + Δ. */
  error_feedback_decay: number
  /** Chunk side: each dimension is cut at its largest divisor at most this. */
  chunk: number
  /** Values kept per chunk. */
  topk: number
  /** Bits per kept value (2^value_bits quantization levels). */
  value_bits: number
  /** α of the outer step θ ← θ − α · aggregate. */
  outer_lr: number
  /** Compress the chunks' 2-D DCT instead of the values. */
  dct: boolean
  /** The inner AdamW. */
  inner: AdamWConfig
}

export type OptimizerConfig = 'Dummy' | {AdamW: AdamWConfig} | {Distro: DistroConfig} | {SparseLoCo: SparseLoCoConfig}

export type LLMArchitecture = 'HfLlama' | 'HfDeepseek' | 'HfAuto'
export type LLMDataType = 'Pretraining' | 'Finetuning'

export interface LLMConfig {
  architecture: LLMArchitecture
  data_type: LLMDataType
  max_seq_len: number
  cold_start_warmup_steps: number
  checkpoint: CheckpointConfig
  data_location: DataLocation
  lr_schedule: LrSchedule
  optimizer: OptimizerConfig
}

export interface ModelConfig {
  LLM: LLMConfig
}

/**
 * A loaded run configuration: a server `state.toml` (run_id, run_state, [config], [model.LLM]) or a
 * run `config.toml` as given to `update-config` ([config] and [model.LLM] only).
 */
export interface RunConfigFile {
  /** The file it came from, as given; relative paths inside resolve against its directory. */
  path: string
  run_id?: string
  run_state?: RunState
  config?: CoordinatorConfig
  model: ModelConfig
}

/** The TCP data server's `data.toml`. */
export interface DataServerConfig {
  path: string
  dir: string
  token_size: TokenSize
  seq_len: number
  /** 32 bytes. */
  shuffle_seed: number[]
}

/** One problem in a config file, located by field path (`config.min_clients`). */
export interface ConfigIssue {
  file: string
  path: string
  message: string
  /** The offending value, rendered for the message, when there is one. */
  value?: string
}
