/**
 * The run config's pure validator: `[config]` and `[model.LLM]` as objects (parsed TOML, or a config_update event)
 * to normalized values or located issues. No I/O: the coordinator runs it. Files are read by run-config-file.ts.
 */
import {CONFIG_FIELDS as COORDINATOR_CONFIG_FIELDS, MAX_CLIENTS, MAX_WITNESSES, constant} from '../layout/layout-table.js'
import {Reader, join, type Table} from './read.js'
import type {
  AdamWConfig,
  CheckpointConfig,
  ConfigIssue,
  CoordinatorConfig,
  DataLocation,
  DistroConfig,
  HttpDataLocation,
  HttpLocation,
  HubRepo,
  LLMConfig,
  LrSchedule,
  OptimizerConfig,
  RunState,
  Shuffle,
  SparseLoCoConfig,
} from './types.js'

/** Psyche's default for `waiting_for_members_extra_time` (its WAITING_FOR_MEMBERS_EXTRA_SECONDS). */
const DEFAULT_WAITING_FOR_MEMBERS_EXTRA_TIME = 3
/** A run id is at most RUN_ID_MAX = 32 bytes in a file, as on Solana (a program address seed; the layout table). */
export {RUN_ID_MAX as MAX_RUN_ID_BYTES} from '../layout/layout-table.js'
/** A file can only start a run before its first epoch; mid-epoch states are never written by hand. */
export const STARTING_RUN_STATES: readonly RunState[] = ['Uninitialized', 'WaitingForMembers', 'Paused']

/**
 * Upper bounds on every size, count and duration of a run config, so a typo (`max_seq_len = 4294967296000`) is
 * refused by validate-config instead of failing a client at join, or never. Psyche's field widths where it has
 * them (u16 client counts and batch sizes, u32 steps); for what it keeps as u64, what a run can use.
 */
export const LIMITS = {
  /** Every duration (phases, epochs): a week. Psyche's longest real epoch_time is 100,000 s (~28 h). */
  seconds: 7 * 24 * 3600,
  /** min_clients, init_min_clients: a coordinator holds MAX_CLIENTS (the layout table, both coordinators). */
  clients: MAX_CLIENTS,
  /** witness_nodes: a round holds MAX_WITNESSES proofs (the layout table). */
  witnesses: MAX_WITNESSES,
  /** global_batch_size_start and _end, in samples (u16). */
  batch: 65_535,
  /** total_steps, rounds_per_epoch and every step count of a schedule (u32). */
  steps: 4_294_967_295,
  /** max_seq_len (and a data.toml's seq_len): tokens per sample. */
  seqLen: 1 << 20,
  /** NumberedFiles num_files. */
  files: 10_000_000,
  /**
   * max_trainers_per_round: half of MAX_CLIENTS. The Solana program's round close finds the chosen trainers with one
   * inverse shuffle of their positions, within its compute budget for at most this many (as for the members with one
   * batch more when every member trains).
   */
  trainersPerRound: MAX_CLIENTS / 2,
  /** verification_sample: the results one verifier scores per round (validate-config refuses more). */
  verificationSample: 64,
} as const

/** Results a verifier scores per round when the config leaves verification_sample out (coordinator/rules.ts). */
export const DEFAULT_VERIFICATION_SAMPLE = 4

/** The [config] keys: those the coordinator account holds (the layout table's Config struct), then the lists. */
const CONFIG_FIELDS = [...COORDINATOR_CONFIG_FIELDS, 'checkpointers', 'verification_sample'] as const

/** Most designated checkpointers a run may name (the layout table: the Solana account holds them too). */
const MAX_CHECKPOINTERS = constant('MAX_CHECKPOINTERS')
/** A client id as a config names it: an identity's hex public key, or a base58 Solana address. */
const CLIENT_ID_RE = /^[0-9A-Za-z]{32,128}$/
const LLM_FIELDS = ['architecture', 'data_type', 'max_seq_len', 'cold_start_warmup_steps', 'checkpoint', 'data_location', 'lr_schedule', 'optimizer'] as const

/**
 * A duration in seconds. Psyche's files hold integers (u64 seconds) and mean the same here; a fraction is our
 * extension (the coordinator's clock is in milliseconds), at most millisecond precision so the coordinator's
 * integer arithmetic is exact. `positive`: Psyche's minimum of 1 for an integer, any fraction above 0 otherwise.
 */
function seconds(r: Reader, t: Table, key: string, path: string, rule: {positive: boolean; default?: number}): number {
  const value = t[key]
  if (typeof value === 'number' && Number.isFinite(value) && !Number.isInteger(value)) {
    const v = r.num(t, key, path, rule.positive ? {above: 0, max: LIMITS.seconds} : {min: 0, max: LIMITS.seconds})
    if (Number.isNaN(v)) return v
    if (Math.abs(v * 1000 - Math.round(v * 1000)) > 1e-6) {
      r.issue(join(path, key), 'must be a whole number of milliseconds (at most 3 decimals)', value)
      return NaN
    }
    return v
  }
  return r.int(t, key, path, {min: rule.positive ? 1 : 0, max: LIMITS.seconds, ...(rule.default !== undefined ? {default: rule.default} : {})})
}

function readCoordinatorConfig(r: Reader, t: Table, path: string): CoordinatorConfig {
  r.known(t, path, CONFIG_FIELDS)
  const config: CoordinatorConfig = {
    warmup_time: seconds(r, t, 'warmup_time', path, {positive: false}),
    cooldown_time: seconds(r, t, 'cooldown_time', path, {positive: true}),
    epoch_time: seconds(r, t, 'epoch_time', path, {positive: true}),
    max_round_train_time: seconds(r, t, 'max_round_train_time', path, {positive: true}),
    round_witness_time: seconds(r, t, 'round_witness_time', path, {positive: true}),
    min_clients: r.int(t, 'min_clients', path, {min: 1, max: LIMITS.clients}),
    init_min_clients: r.int(t, 'init_min_clients', path, {min: 1, max: LIMITS.clients}),
    witness_nodes: r.int(t, 'witness_nodes', path, {min: 0, max: LIMITS.witnesses}),
    verification_percent: r.int(t, 'verification_percent', path, {min: 0, max: 100, default: 0}),
    global_batch_size_start: r.int(t, 'global_batch_size_start', path, {min: 1, max: LIMITS.batch}),
    global_batch_size_end: r.int(t, 'global_batch_size_end', path, {min: 1, max: LIMITS.batch}),
    global_batch_size_warmup_tokens: r.int(t, 'global_batch_size_warmup_tokens', path, {min: 0, default: 0}),
    total_steps: r.int(t, 'total_steps', path, {min: 1, max: LIMITS.steps}),
    waiting_for_members_extra_time: seconds(r, t, 'waiting_for_members_extra_time', path, {positive: false, default: DEFAULT_WAITING_FOR_MEMBERS_EXTRA_TIME}),
  }
  if (t.verification_sample !== undefined) config.verification_sample = r.int(t, 'verification_sample', path, {min: 1, max: LIMITS.verificationSample})
  if (t.rounds_per_epoch !== undefined) config.rounds_per_epoch = r.int(t, 'rounds_per_epoch', path, {min: 1, max: LIMITS.steps})
  if (t.max_trainers_per_round !== undefined) config.max_trainers_per_round = r.int(t, 'max_trainers_per_round', path, {min: 1, max: LIMITS.trainersPerRound})
  if (t.checkpointers !== undefined) {
    const list = t.checkpointers
    const where = join(path, 'checkpointers')
    if (!Array.isArray(list) || list.length === 0 || list.length > MAX_CHECKPOINTERS) {
      r.issue(where, `must be a list of 1 to ${MAX_CHECKPOINTERS} client ids (psyche identity show prints a client's id)`, list)
    } else {
      const bad = list.find((id) => typeof id !== 'string' || !CLIENT_ID_RE.test(id))
      if (bad !== undefined) r.issue(where, 'each entry must be a client id: 32 to 128 letters and digits (a hex identity id or a Solana address)', bad)
      else if (new Set(list).size !== list.length) r.issue(where, 'lists a client twice', list)
      else config.checkpointers = [...(list as string[])]
    }
  }
  return config
}

function readHubRepo(r: Reader, value: unknown, path: string, requireRepo: boolean): HubRepo {
  const t = r.payload(value, path, ['repo_id', 'revision'])
  const repo: HubRepo = {repo_id: r.str(t, 'repo_id', path, {nonEmpty: requireRepo})}
  if (t.revision !== undefined) repo.revision = r.str(t, 'revision', path, {nonEmpty: true})
  return repo
}

function readCheckpoint(r: Reader, llm: Table, path: string): CheckpointConfig | undefined {
  const gcs = (value: unknown, at: string) => {
    const t = r.payload(value, at, ['bucket', 'prefix'])
    const repo: {bucket: string; prefix?: string} = {bucket: r.str(t, 'bucket', at, {nonEmpty: true})}
    if (t.prefix !== undefined) repo.prefix = r.str(t, 'prefix', at)
    return repo
  }
  return r.tagged<CheckpointConfig>(llm, 'checkpoint', path, {
    unit: ['Ephemeral'],
    data: {
      // Dummy is Psyche's test checkpoint: an empty repo id is how its own test config writes it.
      Dummy: (v, at) => ({Dummy: readHubRepo(r, v, at, false)}),
      Hub: (v, at) => ({Hub: readHubRepo(r, v, at, true)}),
      P2P: (v, at) => ({P2P: readHubRepo(r, v, at, true)}),
      Gcs: (v, at) => ({Gcs: gcs(v, at)}),
      P2PGcs: (v, at) => ({P2PGcs: gcs(v, at)}),
      Local: (v, at) => {
        const t = r.payload(v, at, ['path'])
        return {Local: {path: r.str(t, 'path', at, {nonEmpty: true})}}
      },
    },
  })
}

function readShuffle(r: Reader, t: Table, path: string): Shuffle {
  const shuffle = r.tagged<Shuffle>(t, 'shuffle', path, {
    unit: ['DontShuffle'],
    data: {
      Seeded: (v, at) => {
        if (!Array.isArray(v) || v.length !== 32 || !v.every((b) => Number.isInteger(b) && b >= 0 && b <= 255)) {
          r.issue(at, 'must be 32 integers from 0 to 255', v)
          return {Seeded: []}
        }
        return {Seeded: v as number[]}
      },
    },
  })
  return shuffle ?? 'DontShuffle'
}

function readHttpLocation(r: Reader, t: Table, path: string): HttpLocation | undefined {
  return r.tagged<HttpLocation>(t, 'location', path, {
    data: {
      SingleUrl: (v, at) => {
        if (typeof v !== 'string' || !/^https?:\/\/\S+$/.test(v)) r.issue(at, 'must be an http(s) URL', v)
        return {SingleUrl: String(v)}
      },
      NumberedFiles: (v, at) => {
        const p = r.payload(v, at, ['url_template', 'start_index', 'n_left_pad_zeros', 'num_files'])
        return {
          NumberedFiles: {
            url_template: r.str(p, 'url_template', at, {nonEmpty: true}),
            start_index: r.int(p, 'start_index', at, {min: 0, max: LIMITS.files}),
            n_left_pad_zeros: r.int(p, 'n_left_pad_zeros', at, {min: 0, max: 255}),
            num_files: r.int(p, 'num_files', at, {min: 1, max: LIMITS.files}),
          },
        }
      },
      Gcp: (v, at) => {
        const p = r.payload(v, at, ['bucket_name', 'filter_directory'])
        // Psyche: an empty filter_directory means the whole bucket.
        return {Gcp: {bucket_name: r.str(p, 'bucket_name', at, {nonEmpty: true}), filter_directory: r.str(p, 'filter_directory', at, {default: ''})}}
      },
    },
  })
}

function readDataLocation(r: Reader, llm: Table, path: string): DataLocation | undefined {
  const nonEmptyString = (v: unknown, at: string): string => {
    if (typeof v !== 'string' || v.trim() === '') r.issue(at, 'must be a non-empty string', v)
    return String(v)
  }
  return r.tagged<DataLocation>(llm, 'data_location', path, {
    unit: ['Dummy'],
    data: {
      Server: (v, at) => {
        if (typeof v !== 'string' || !/^\S+:\d{1,5}$/.test(v)) r.issue(at, 'must be "host:port"', v)
        return {Server: String(v)}
      },
      Local: (v, at) => ({Local: nonEmptyString(v, at)}),
      Http: (v, at) => {
        const t = r.payload(v, at, ['location', 'token_size_in_bytes', 'shuffle'])
        const http: HttpDataLocation = {
          location: readHttpLocation(r, t, at) ?? {SingleUrl: ''},
          token_size_in_bytes: r.oneOf(t, 'token_size_in_bytes', at, ['TwoBytes', 'FourBytes']),
          shuffle: readShuffle(r, t, at),
        }
        return {Http: http}
      },
      WeightedHttp: (v, at) => {
        if (typeof v !== 'string' || !/^https?:\/\/\S+$/.test(v)) r.issue(at, 'must be an http(s) URL of a JSON list of weighted data locations', v)
        return {WeightedHttp: String(v)}
      },
      Preprocessed: (v, at) => ({Preprocessed: nonEmptyString(v, at)}),
    },
  })
}

function readLrSchedule(r: Reader, llm: Table, path: string): LrSchedule | undefined {
  const base = (t: Table, at: string) => ({
    base_lr: r.num(t, 'base_lr', at, {min: 0}),
    warmup_steps: r.int(t, 'warmup_steps', at, {min: 0, max: LIMITS.steps}),
    warmup_init_lr: r.num(t, 'warmup_init_lr', at, {min: 0}),
  })
  const decaying = (v: unknown, at: string) => {
    const t = r.payload(v, at, ['base_lr', 'warmup_steps', 'warmup_init_lr', 'total_steps', 'final_lr'])
    const lr = {...base(t, at), total_steps: r.int(t, 'total_steps', at, {min: 1, max: LIMITS.steps}), final_lr: r.num(t, 'final_lr', at, {min: 0})}
    // Psyche divides by (total_steps - warmup_steps) after warmup.
    if (lr.warmup_steps >= lr.total_steps) r.issue(`${at}.warmup_steps`, `must be < total_steps (${lr.total_steps})`, lr.warmup_steps)
    return lr
  }
  return r.tagged<LrSchedule>(llm, 'lr_schedule', path, {
    data: {
      Constant: (v, at) => ({Constant: base(r.payload(v, at, ['base_lr', 'warmup_steps', 'warmup_init_lr']), at)}),
      Linear: (v, at) => ({Linear: decaying(v, at)}),
      Cosine: (v, at) => ({Cosine: decaying(v, at)}),
      WarmupStableDecay: (v, at) => {
        const t = r.payload(v, at, [
          'base_lr',
          'warmup_steps',
          'warmup_init_lr',
          'stable_steps',
          'cosine_decay_steps',
          'cosine_decay_final_lr',
          'linear_decay_steps',
          'linear_decay_final_lr',
        ])
        const lr = {
          ...base(t, at),
          stable_steps: r.int(t, 'stable_steps', at, {min: 0, max: LIMITS.steps}),
          cosine_decay_steps: r.int(t, 'cosine_decay_steps', at, {min: 0, max: LIMITS.steps}),
          cosine_decay_final_lr: r.num(t, 'cosine_decay_final_lr', at, {min: 0}),
          linear_decay_steps: r.int(t, 'linear_decay_steps', at, {min: 0, max: LIMITS.steps}),
          linear_decay_final_lr: r.num(t, 'linear_decay_final_lr', at, {min: 0}),
        }
        // Psyche asserts these while computing the rate; a file breaking them would crash every client mid-run.
        if (lr.cosine_decay_final_lr > lr.base_lr) r.issue(`${at}.cosine_decay_final_lr`, `must be ≤ base_lr (${lr.base_lr})`, lr.cosine_decay_final_lr)
        if (lr.linear_decay_final_lr > lr.cosine_decay_final_lr)
          r.issue(`${at}.linear_decay_final_lr`, `must be ≤ cosine_decay_final_lr (${lr.cosine_decay_final_lr})`, lr.linear_decay_final_lr)
        return {WarmupStableDecay: lr}
      },
    },
  })
}

/**
 * DisTrO limits, the same in the worker (python/psyche_worker/distro.py DistroConfig.validate; a test compares
 * both on the boundaries): a chunk side of at most 4096 (the DCT basis is chunk² floats), top-k at most the chunk.
 */
export const DISTRO_MAX_CHUNK = 4096

/**
 * SparseLoCo's limits and defaults, the same in the worker (python/psyche_worker/optim/sparseloco.py SparseLoCoConfig;
 * test/config/sparseloco-limits.test.ts compares both on the boundaries). Defaults are τemplar's (hparams/hparams.json).
 */
export const SPARSELOCO_LIMITS = {innerSteps: 10_000, chunk: 4096, valueBits: 8, outerLr: 100} as const
const SPARSELOCO_DEFAULTS = {inner_steps: 30, error_feedback_decay: 0.95, chunk: 64, topk: 64, value_bits: 2, outer_lr: 0.4, dct: false} as const
const SPARSELOCO_INNER_DEFAULTS: AdamWConfig = {betas: [0.9, 0.95], weight_decay: 0.1, eps: 1e-8, clip_grad_norm: 1.0}

/**
 * Inner steps per round: H for SparseLoCo, 1 for every other optimizer. A round's batch is this many global batches
 * (coordinator/rules.ts), and the worker splits a client's share into this many inner steps.
 */
export function innerSteps(optimizer: OptimizerConfig | undefined): number {
  return typeof optimizer === 'object' && 'SparseLoCo' in optimizer ? optimizer.SparseLoCo.inner_steps : 1
}

/** Whether an optimizer's rounds exchange results between clients, as the network path needs: Distro and SparseLoCo. */
export function exchangesResults(optimizer: OptimizerConfig | undefined): optimizer is {Distro: DistroConfig} | {SparseLoCo: SparseLoCoConfig} {
  return typeof optimizer === 'object' && ('Distro' in optimizer || 'SparseLoCo' in optimizer)
}

/** An AdamW table ([model.LLM.optimizer.AdamW], or SparseLoCo's inner one, whose missing fields take `defaults`). */
function readAdamW(r: Reader, v: unknown, at: string, defaults?: AdamWConfig): AdamWConfig {
  const t = r.payload(v, at, ['betas', 'weight_decay', 'eps', 'clip_grad_norm'])
  const betas = t.betas ?? defaults?.betas
  if (!Array.isArray(betas) || betas.length !== 2 || !betas.every((b) => typeof b === 'number' && b >= 0 && b < 1)) {
    r.issue(`${at}.betas`, betas === undefined ? 'missing (expected [beta1, beta2], each in [0, 1))' : 'must be [beta1, beta2], each in [0, 1)', betas)
  }
  const adamw: AdamWConfig = {
    betas: Array.isArray(betas) && betas.length === 2 ? [Number(betas[0]), Number(betas[1])] : [NaN, NaN],
    weight_decay: t.weight_decay === undefined && defaults ? defaults.weight_decay : r.num(t, 'weight_decay', at, {min: 0}),
    eps: t.eps === undefined && defaults ? defaults.eps : r.num(t, 'eps', at, {above: 0}),
  }
  if (t.clip_grad_norm !== undefined) adamw.clip_grad_norm = r.num(t, 'clip_grad_norm', at, {above: 0})
  else if (defaults?.clip_grad_norm !== undefined) adamw.clip_grad_norm = defaults.clip_grad_norm
  return adamw
}

function readSparseLoCo(r: Reader, v: unknown, at: string): SparseLoCoConfig {
  const t = r.payload(v, at, ['inner_steps', 'error_feedback_decay', 'chunk', 'topk', 'value_bits', 'outer_lr', 'dct', 'inner'])
  const d = SPARSELOCO_DEFAULTS
  const number = (key: 'error_feedback_decay' | 'outer_lr', rule: {min?: number; max?: number; above?: number}) => (t[key] === undefined ? d[key] : r.num(t, key, at, rule))
  const chunk = r.int(t, 'chunk', at, {min: 1, max: SPARSELOCO_LIMITS.chunk, default: d.chunk})
  const config: SparseLoCoConfig = {
    inner_steps: r.int(t, 'inner_steps', at, {min: 1, max: SPARSELOCO_LIMITS.innerSteps, default: d.inner_steps}),
    error_feedback_decay: number('error_feedback_decay', {min: 0, max: 1}),
    chunk,
    // at most a 2-D chunk's elements (a smaller chunk takes all of its own)
    topk: r.int(t, 'topk', at, {min: 1, max: Number.isInteger(chunk) ? chunk * chunk : SPARSELOCO_LIMITS.chunk ** 2, default: d.topk}),
    value_bits: r.int(t, 'value_bits', at, {min: 1, max: SPARSELOCO_LIMITS.valueBits, default: d.value_bits}),
    outer_lr: number('outer_lr', {above: 0, max: SPARSELOCO_LIMITS.outerLr}),
    dct: t.dct === undefined ? d.dct : r.bool(t, 'dct', at),
    inner: readAdamW(r, t.inner ?? {}, `${at}.inner`, SPARSELOCO_INNER_DEFAULTS),
  }
  return config
}

function readOptimizer(r: Reader, llm: Table, path: string): OptimizerConfig | undefined {
  return r.tagged<OptimizerConfig>(llm, 'optimizer', path, {
    unit: ['Dummy'],
    data: {
      AdamW: (v, at) => ({AdamW: readAdamW(r, v, at)}),
      SparseLoCo: (v, at) => ({SparseLoCo: readSparseLoCo(r, v, at)}),
      Distro: (v, at) => {
        const t = r.payload(v, at, ['clip_grad_norm', 'weight_decay', 'compression_decay', 'compression_chunk', 'compression_topk', 'quantize_1bit'])
        const distro: DistroConfig = {
          compression_decay: r.num(t, 'compression_decay', at, {min: 0, max: 1}),
          compression_chunk: r.int(t, 'compression_chunk', at, {min: 1, max: DISTRO_MAX_CHUNK}),
          compression_topk: r.int(t, 'compression_topk', at, {min: 1, max: DISTRO_MAX_CHUNK}),
          quantize_1bit: r.bool(t, 'quantize_1bit', at),
        }
        // The worker's DistroConfig.validate enforces the same: keep-k of a chunk can be at most a 1-D chunk's coefficients.
        if (Number.isInteger(distro.compression_topk) && Number.isInteger(distro.compression_chunk) && distro.compression_topk > distro.compression_chunk) {
          r.issue(
            `${at}.compression_topk`,
            `must be at most compression_chunk (${distro.compression_chunk}): a chunk of a 1-D tensor has that many coefficients`,
            distro.compression_topk,
          )
        }
        if (t.clip_grad_norm !== undefined) distro.clip_grad_norm = r.num(t, 'clip_grad_norm', at, {above: 0})
        if (t.weight_decay !== undefined) distro.weight_decay = r.num(t, 'weight_decay', at, {min: 0})
        return {Distro: distro}
      },
    },
  })
}

function readLLM(r: Reader, t: Table, path: string): LLMConfig {
  r.known(t, path, LLM_FIELDS)
  return {
    architecture: r.oneOf(t, 'architecture', path, ['HfLlama', 'HfDeepseek', 'HfAuto']),
    data_type: r.oneOf(t, 'data_type', path, ['Pretraining', 'Finetuning']),
    max_seq_len: r.int(t, 'max_seq_len', path, {min: 1, max: LIMITS.seqLen}),
    cold_start_warmup_steps: r.int(t, 'cold_start_warmup_steps', path, {min: 0, max: LIMITS.steps, default: 0}),
    checkpoint: readCheckpoint(r, t, path) ?? 'Ephemeral',
    data_location: readDataLocation(r, t, path) ?? 'Dummy',
    lr_schedule: readLrSchedule(r, t, path) ?? {Constant: {base_lr: NaN, warmup_steps: 0, warmup_init_lr: 0}},
    optimizer: readOptimizer(r, t, path) ?? 'Dummy',
  }
}

/** Rules that span fields, checked only when each field on its own is valid (so one mistake is reported once). */
function checkCrossFieldRules(r: Reader, config: CoordinatorConfig, llm: LLMConfig): void {
  const ok = (...values: number[]) => values.every(Number.isFinite)
  const c = config
  if (ok(c.init_min_clients, c.min_clients) && c.init_min_clients < c.min_clients) {
    r.issue('config.init_min_clients', `must be ≥ min_clients (${c.min_clients})`, c.init_min_clients)
  }
  if (ok(c.witness_nodes, c.min_clients) && c.witness_nodes > c.min_clients) {
    r.issue('config.witness_nodes', `must be ≤ min_clients (${c.min_clients}), or 0 for automatic: a round must be able to find that many witnesses`, c.witness_nodes)
  }
  if (ok(c.global_batch_size_start, c.global_batch_size_end) && c.global_batch_size_end < c.global_batch_size_start) {
    r.issue('config.global_batch_size_end', `must be ≥ global_batch_size_start (${c.global_batch_size_start})`, c.global_batch_size_end)
  }
  if (ok(c.global_batch_size_start, c.init_min_clients) && c.global_batch_size_start < c.init_min_clients) {
    r.issue(
      'config.global_batch_size_start',
      `must be ≥ init_min_clients (${c.init_min_clients}): every client of the first round needs at least one batch`,
      c.global_batch_size_start,
    )
  }
  if (
    ok(c.global_batch_size_start, c.global_batch_size_end, c.global_batch_size_warmup_tokens) &&
    c.global_batch_size_start !== c.global_batch_size_end &&
    c.global_batch_size_warmup_tokens === 0
  ) {
    r.issue(
      'config.global_batch_size_warmup_tokens',
      `must be > 0 when global_batch_size_start (${c.global_batch_size_start}) ≠ global_batch_size_end (${c.global_batch_size_end}): the batch size ramps over these tokens`,
      0,
    )
  }
  if (ok(c.global_batch_size_warmup_tokens, c.total_steps, c.global_batch_size_end, llm.max_seq_len)) {
    const runTokens = c.total_steps * c.global_batch_size_end * llm.max_seq_len
    if (c.global_batch_size_warmup_tokens > runTokens) {
      r.issue(
        'config.global_batch_size_warmup_tokens',
        `exceeds the whole run's ${runTokens} tokens (total_steps × global_batch_size_end × model.LLM.max_seq_len): the batch size would never reach global_batch_size_end`,
        c.global_batch_size_warmup_tokens,
      )
    }
  }
  if (ok(c.epoch_time, c.max_round_train_time, c.round_witness_time) && c.epoch_time < c.max_round_train_time + c.round_witness_time) {
    r.issue(
      'config.epoch_time',
      `must be ≥ max_round_train_time + round_witness_time (${c.max_round_train_time + c.round_witness_time}): an epoch must fit one round`,
      c.epoch_time,
    )
  }
  if (ok(c.total_steps, llm.cold_start_warmup_steps) && llm.cold_start_warmup_steps > c.total_steps) {
    r.issue('model.LLM.cold_start_warmup_steps', `must be ≤ config.total_steps (${c.total_steps})`, llm.cold_start_warmup_steps)
  }
  if (llm.checkpoint === 'Ephemeral') {
    // Psyche's own model check rejects it too: an ephemeral model exists only in running clients.
    r.issue('model.LLM.checkpoint', 'Ephemeral cannot start a run: no client would have the model (use Hub, P2P, Local or Dummy)', 'Ephemeral')
  }
}

/**
 * Validates a run's `[config]` and `[model.LLM]` given as objects in the TOML's shape (e.g. from a
 * `config_update` event) and returns them normalized (defaults filled), or the issues found.
 */
export function validateRunConfig(config: unknown, model: unknown, file = 'config'): {config: CoordinatorConfig; model: {LLM: LLMConfig}} | {issues: ConfigIssue[]} {
  const r = new Reader(file)
  const root: Table = {config, model}
  const result = readRunSections(r, root)
  return r.issues.length > 0 || result === undefined ? {issues: r.issues} : result
}

/** The `[config]` and `[model]` sections of a parsed run config, read with `r` (issues recorded there). */
export function readRunSections(r: Reader, root: Table): {config: CoordinatorConfig; model: {LLM: LLMConfig}} | undefined {
  const configTable = r.table(root, 'config', '')
  const modelTable = r.table(root, 'model', '')
  let llm: LLMConfig | undefined
  if (modelTable) {
    r.known(modelTable, 'model', ['LLM'])
    const llmTable = r.table(modelTable, 'LLM', 'model')
    if (llmTable) llm = readLLM(r, llmTable, 'model.LLM')
  }
  const config = configTable ? readCoordinatorConfig(r, configTable, 'config') : undefined
  if (config && llm) checkCrossFieldRules(r, config, llm)
  return config && llm ? {config, model: {LLM: llm}} : undefined
}
