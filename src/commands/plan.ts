import {readFileSync} from 'node:fs'
import {dirname, join, resolve} from 'node:path'
import {Flags} from '@oclif/core'
import {PsycheCommand} from '../core/cli/base-command.js'
import {loadRunConfigFile} from '../core/config/index.js'
import {PsycheError} from '../core/errors.js'
import {type MemoryPlan, type ModelConfig, type PlanOptimizer, memoryPlan} from '../core/train/memory-plan.js'

const GIB = 2 ** 30
const STATE_NAMES: Record<PlanOptimizer, string> = {distro: 'DisTrO state', sparseloco: 'SparseLoCo state', adamw: 'AdamW state'}

/** What a run config gives the plan: its optimizer and chunks, its sequence length, its local model directory. */
async function fromRunConfig(path: string): Promise<{optimizer: PlanOptimizer; chunk?: number; topk?: number; seqLen?: number; model?: string}> {
  const run = await loadRunConfigFile(path)
  const llm = run.model.LLM
  const opt = llm.optimizer
  const checkpoint = llm.checkpoint
  const model = typeof checkpoint === 'object' && 'Local' in checkpoint ? resolve(dirname(resolve(path)), checkpoint.Local.path) : undefined
  const base = {seqLen: llm.max_seq_len, model}
  if (typeof opt === 'object' && 'Distro' in opt) return {...base, optimizer: 'distro', chunk: opt.Distro.compression_chunk}
  if (typeof opt === 'object' && 'SparseLoCo' in opt) return {...base, optimizer: 'sparseloco', chunk: opt.SparseLoCo.chunk, topk: opt.SparseLoCo.topk}
  if (typeof opt === 'object' && 'AdamW' in opt) return {...base, optimizer: 'adamw'}
  throw new PsycheError(`${path}: model.LLM.optimizer ${JSON.stringify(opt)} keeps no state psyche plan knows (Distro, SparseLoCo, AdamW)`)
}

export default class Plan extends PsycheCommand {
  static summary = 'The memory each rank of a client needs for a model, from its config alone, and whether it fits'
  static description =
    "For a model held in --devices shards (join --shard N): each rank's parameters and gradients (fp32), the optimizer's state (DisTrO: momentum, the committed copy and the speculation's signs, 9 bytes per parameter held; SparseLoCo: error feedback, the inner AdamW's two moments, the committed copy and the round's start copy, 20 bytes; AdamW, unsharded only: 8 bytes), an estimate of the activations of one micro-batch, and what is gathered or copied for a moment (one decoder layer; one whole gradient; SparseLoCo's top-k selections). The optimizer, its chunk and the sequence length come from --config (a run config) or the flags. A tensor whose first dimension does not split on the optimizer's chunk boundaries stays whole on every rank, as in the worker. Llama and DeepSeek-V3 configs."
  static examples = [
    '<%= config.bin %> plan --model templates/llama-8b/model --devices 8',
    '<%= config.bin %> plan --config templates/deepseek-v3-small/state.toml --devices 4',
    '<%= config.bin %> plan --model templates/llama-1b/model --optimizer sparseloco --devices 1 --device-memory 24 --json',
  ]

  static flags = {
    model: Flags.string({summary: "model directory (its config.json); default: --config's Local checkpoint"}),
    config: Flags.string({summary: 'a run config (state.toml): its optimizer, chunk, top-k and max_seq_len'}),
    optimizer: Flags.string({summary: "whose state to count (default: --config's, else distro)", options: ['distro', 'sparseloco', 'adamw']}),
    devices: Flags.integer({summary: 'ranks the model is sharded across (join --shard N)', default: 1, min: 1}),
    'micro-batch': Flags.integer({summary: 'sequences per forward pass', default: 1, min: 1}),
    'seq-len': Flags.integer({summary: "tokens per sequence (default: --config's max_seq_len, else the config's max_position_embeddings, at most 2048)", min: 1}),
    chunk: Flags.integer({summary: "the optimizer's chunk (DisTrO's compression_chunk, SparseLoCo's chunk; default: --config's, else 64)", min: 1}),
    topk: Flags.integer({summary: "SparseLoCo's top-k per chunk (default: --config's, else 64)", min: 1}),
    precision: Flags.string({summary: 'forward precision (bf16 autocast keeps 2-byte activations)', options: ['bf16', 'fp32'], default: 'bf16'}),
    'device-memory': Flags.integer({summary: 'GiB of memory per device, to say whether a rank fits', default: 80, min: 1}),
  }

  async run(): Promise<MemoryPlan> {
    const {flags} = await this.parse(Plan)
    const run = flags.config ? await fromRunConfig(flags.config) : undefined
    const dir = flags.model ?? run?.model
    if (!dir)
      throw new PsycheError(
        flags.config ? `${flags.config}: its checkpoint is not a Local model directory: give --model DIR` : 'give --model DIR (a model config.json) or --config RUN.toml',
      )
    const path = join(dir, 'config.json')
    let config: ModelConfig
    try {
      config = JSON.parse(readFileSync(path, 'utf8')) as ModelConfig
    } catch (error) {
      throw new PsycheError(`${path}: cannot read a model config (${(error as Error).message})`)
    }
    const optimizer = (flags.optimizer as PlanOptimizer | undefined) ?? run?.optimizer ?? 'distro'
    const fromConfig = run?.optimizer === optimizer ? run : undefined
    const positions = typeof config.max_position_embeddings === 'number' ? config.max_position_embeddings : 2048
    const seqLen = flags['seq-len'] ?? run?.seqLen ?? Math.min(positions, 2048)
    const plan = memoryPlan(config, {
      shards: flags.devices,
      microBatch: flags['micro-batch'],
      seqLen,
      optimizer,
      chunk: flags.chunk ?? fromConfig?.chunk,
      topk: flags.topk ?? fromConfig?.topk,
      precision: flags.precision as 'bf16' | 'fp32',
      deviceBytes: flags['device-memory'] * GIB,
    })
    if (!this.jsonEnabled()) {
      const gib = (n: number) => (n >= GIB || n === 0 ? `${(n / GIB).toFixed(2)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`)
      const r = plan.per_rank
      const parts = Object.entries(r.optimizer_state_parts)
        .map(([name, bytes]) => `${name.replaceAll('_', ' ')} ${gib(bytes)}`)
        .join(', ')
      this.log(
        `${plan.parameters.toLocaleString('en-US')} parameters (${plan.model_type}) in ${plan.shards} shard(s); micro-batch ${flags['micro-batch']} × ${seqLen} tokens, ${flags.precision}`,
      )
      this.log(`per rank: parameters ${gib(r.parameters)}, gradients ${gib(r.gradients)}, ${STATE_NAMES[optimizer]} ${gib(r.optimizer_state)} (${parts})`)
      this.log(`          activations ~${gib(r.activations)}, gathered or copied for a moment ${gib(r.transient)}`)
      this.log(`          total ~${gib(r.total)} of ${flags['device-memory']} GiB: ${plan.fits ? 'fits' : 'does NOT fit'}`)
      if (plan.whole_tensors.length > 0)
        this.log(
          `whole on every rank (first dimension not a multiple of ${plan.shards} chunks): ${plan.whole_tensors.slice(0, 6).join(', ')}${plan.whole_tensors.length > 6 ? `, … (${plan.whole_tensors.length} in all)` : ''}`,
        )
    }
    return plan
  }
}
