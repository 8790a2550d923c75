import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {Flags} from '@oclif/core'
import {PsycheCommand} from '../core/cli/base-command.js'
import {PsycheError} from '../core/errors.js'
import {type LlamaShape, type MemoryPlan, memoryPlan} from '../core/train/memory-plan.js'

const GIB = 2 ** 30

export default class Plan extends PsycheCommand {
  static summary = 'The memory each rank of a client needs for a model, from its config alone, and whether it fits'
  static description =
    "For a model held in --devices shards (join --shard N): each rank's parameters, gradients and DisTrO state (fp32 weights and gradients, momentum, the committed copy and the speculation's signs: 17 bytes per parameter held), an estimate of the activations of one micro-batch, and what is gathered for a moment (one decoder layer, one whole gradient). A tensor whose first dimension does not split on DisTrO's chunk boundaries stays whole on every rank, as in the worker."
  static examples = [
    '<%= config.bin %> plan --model templates/llama-8b/model --devices 8',
    '<%= config.bin %> plan --model templates/llama-1b/model --devices 1 --device-memory 24 --json',
  ]

  static flags = {
    model: Flags.string({summary: 'model directory (its config.json)', required: true}),
    devices: Flags.integer({summary: 'ranks the model is sharded across (join --shard N)', default: 1, min: 1}),
    'micro-batch': Flags.integer({summary: 'sequences per forward pass', default: 1, min: 1}),
    'seq-len': Flags.integer({summary: 'tokens per sequence (default: the config’s max_position_embeddings, at most 2048)', min: 1}),
    chunk: Flags.integer({summary: "DisTrO's compression_chunk", default: 64, min: 1}),
    precision: Flags.string({summary: 'forward precision (bf16 autocast keeps 2-byte activations)', options: ['bf16', 'fp32'], default: 'bf16'}),
    'device-memory': Flags.integer({summary: 'GiB of memory per device, to say whether a rank fits', default: 80, min: 1}),
  }

  async run(): Promise<MemoryPlan> {
    const {flags} = await this.parse(Plan)
    const path = join(flags.model, 'config.json')
    let config: LlamaShape
    try {
      config = JSON.parse(readFileSync(path, 'utf8')) as LlamaShape
    } catch (error) {
      throw new PsycheError(`${path}: cannot read a model config (${(error as Error).message})`)
    }
    const seqLen = flags['seq-len'] ?? Math.min(config.max_position_embeddings ?? 2048, 2048)
    const plan = memoryPlan(config, {
      shards: flags.devices,
      microBatch: flags['micro-batch'],
      seqLen,
      chunk: flags.chunk,
      precision: flags.precision as 'bf16' | 'fp32',
      deviceBytes: flags['device-memory'] * GIB,
    })
    if (!this.jsonEnabled()) {
      const gib = (n: number) => `${(n / GIB).toFixed(2)} GiB`
      const r = plan.per_rank
      this.log(`${plan.parameters.toLocaleString('en-US')} parameters in ${plan.shards} shard(s); micro-batch ${flags['micro-batch']} × ${seqLen} tokens, ${flags.precision}`)
      this.log(`per rank: parameters ${gib(r.parameters)}, gradients ${gib(r.gradients)}, DisTrO state ${gib(r.optimizer_state)}`)
      this.log(`          activations ~${gib(r.activations)}, gathered for a moment ${gib(r.transient)}`)
      this.log(`          total ~${gib(r.total)} of ${flags['device-memory']} GiB: ${plan.fits ? 'fits' : 'does NOT fit'}`)
      if (plan.whole_tensors.length > 0)
        this.log(
          `whole on every rank (first dimension not a multiple of ${plan.shards} chunks): ${plan.whole_tensors.slice(0, 6).join(', ')}${plan.whole_tensors.length > 6 ? ', …' : ''}`,
        )
    }
    return plan
  }
}
