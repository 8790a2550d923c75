import type {CheckpointConfig, DataLocation, LrSchedule, OptimizerConfig, RunConfigFile} from './types.js'
import {programUnsupported, unsupportedFeatures, type UnsupportedFeature} from './support.js'
import {innerSteps} from './run-config.js'

/** What `psyche server validate-config` reports about a valid run. */
export interface RunSummary {
  file: string
  kind: 'server state' | 'run config'
  run_id?: string
  run_state?: string
  architecture: string
  max_seq_len: number
  checkpoint: string
  data_location: string
  lr_schedule: string
  optimizer: string
  min_clients: number
  init_min_clients: number
  witness_nodes: string
  /** max_trainers_per_round, or null when every member trains each round. */
  max_trainers_per_round: number | null
  global_batch_size: string
  /** Rounds (coordinator steps) the run makes. */
  total_steps: number
  /** Optimizer steps each round trains (SparseLoCo's inner steps; 1 otherwise). */
  inner_steps: number
  /** Tokens the whole run trains on: total_steps × global batch (after its ramp) × max_seq_len (an upper bound during the ramp). */
  total_tokens: number
  unsupported: UnsupportedFeature[]
  /** What the Solana program cannot run of it (create-run and update-config refuse it); the centralized server can. */
  solana_unsupported: UnsupportedFeature[]
}

function describeCheckpoint(c: CheckpointConfig): string {
  if (typeof c === 'string') return c
  if ('Local' in c) return `Local ${c.Local.path}`
  if ('Gcs' in c || 'P2PGcs' in c) {
    const [variant, repo] = Object.entries(c)[0] as [string, {bucket: string}]
    return `${variant} ${repo.bucket}`
  }
  const [variant, repo] = Object.entries(c)[0] as [string, {repo_id: string; revision?: string}]
  return `${variant} ${repo.repo_id || '(none)'}${repo.revision ? `@${repo.revision}` : ''}`
}

function describeData(d: DataLocation): string {
  if (typeof d === 'string') return d
  if ('Http' in d) {
    const loc = d.Http.location
    const where =
      'SingleUrl' in loc
        ? loc.SingleUrl
        : 'NumberedFiles' in loc
          ? `${loc.NumberedFiles.num_files} files ${loc.NumberedFiles.url_template}`
          : `gs://${loc.Gcp.bucket_name}/${loc.Gcp.filter_directory}`
    return `Http ${where} (${d.Http.token_size_in_bytes})`
  }
  const [variant, value] = Object.entries(d)[0]
  return `${variant} ${value}`
}

function describeLr(lr: LrSchedule): string {
  const [variant, p] = Object.entries(lr)[0] as [string, {base_lr: number; warmup_steps: number}]
  return `${variant} base_lr ${p.base_lr}, ${p.warmup_steps} warmup steps`
}

function describeOptimizer(o: OptimizerConfig): string {
  if (typeof o === 'string') return o
  if ('AdamW' in o) return `AdamW betas ${o.AdamW.betas.join('/')}, weight_decay ${o.AdamW.weight_decay}`
  if ('SparseLoCo' in o) {
    const s = o.SparseLoCo
    return `SparseLoCo ${s.inner_steps} inner steps, chunk ${s.chunk}, top-k ${s.topk}, ${s.value_bits}-bit, outer_lr ${s.outer_lr}${s.dct ? ', DCT' : ''}`
  }
  const d = o.Distro
  return `Distro chunk ${d.compression_chunk}, top-k ${d.compression_topk}${d.quantize_1bit ? ', 1-bit' : ''}`
}

export function summarizeRunConfig(file: RunConfigFile): RunSummary {
  const c = file.config!
  const llm = file.model.LLM
  return {
    file: file.path,
    kind: file.run_id !== undefined ? 'server state' : 'run config',
    ...(file.run_id !== undefined ? {run_id: file.run_id} : {}),
    ...(file.run_state !== undefined ? {run_state: file.run_state} : {}),
    architecture: llm.architecture,
    max_seq_len: llm.max_seq_len,
    checkpoint: describeCheckpoint(llm.checkpoint),
    data_location: describeData(llm.data_location),
    lr_schedule: describeLr(llm.lr_schedule),
    optimizer: describeOptimizer(llm.optimizer),
    min_clients: c.min_clients,
    init_min_clients: c.init_min_clients,
    witness_nodes: c.witness_nodes === 0 ? 'automatic' : String(c.witness_nodes),
    max_trainers_per_round: c.max_trainers_per_round ?? null,
    global_batch_size:
      c.global_batch_size_start === c.global_batch_size_end
        ? String(c.global_batch_size_end)
        : `${c.global_batch_size_start} → ${c.global_batch_size_end} over ${c.global_batch_size_warmup_tokens} tokens`,
    total_steps: c.total_steps,
    inner_steps: innerSteps(llm.optimizer),
    // a SparseLoCo round trains inner_steps global batches
    total_tokens: c.total_steps * c.global_batch_size_end * innerSteps(llm.optimizer) * llm.max_seq_len,
    unsupported: unsupportedFeatures(file),
    solana_unsupported: programUnsupported(file),
  }
}
