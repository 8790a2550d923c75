import {PsycheError} from '../errors.js'

/**
 * What one rank of a client needs, from a model's config.json alone (`psyche plan`): the bytes of its parameters,
 * gradients and optimizer state when the model is held in `shards` shards (python/psyche_worker/sharding.py), an
 * estimate of the activations of one micro-batch, and what is gathered or copied for a moment.
 *
 * The split rule is the worker's: a tensor is split into `shards` row blocks only when its first dimension is a
 * multiple of `shards` × the rows of one chunk of the optimizer (the largest divisor ≤ the chunk of a 1-D or 2-D
 * tensor's first dimension; 1 for a 3-D one, whose leading dimensions are chunked one by one); otherwise every rank
 * holds it whole. Every parameter is fp32 (4 bytes), and so is its gradient. The optimizer's state per parameter held
 * (the network path, with delay correction, as `psyche join` trains):
 * - DisTrO: momentum (4), the committed copy (4), the speculation's int8 signs (1);
 * - SparseLoCo: error feedback (4), the inner AdamW's two moments (8), the committed copy (4), and the round's start
 *   copy that the inner steps hold (4: θ_start, restored after them);
 * - AdamW (unsharded only): its two moments (8).
 */
export type ModelConfig = Record<string, unknown>

export type PlanOptimizer = 'distro' | 'sparseloco' | 'adamw'

interface MemoryPlanOptions {
  shards: number
  microBatch: number
  seqLen: number
  /** The optimizer whose state is counted (default DisTrO). */
  optimizer?: PlanOptimizer
  /** The optimizer's chunk side: DisTrO's compression_chunk, SparseLoCo's chunk (default 64). */
  chunk?: number
  /** SparseLoCo's top-k per chunk (default 64): the size of the selections gathered to produce a result. */
  topk?: number
  /** Forward precision: bf16 autocast keeps 2-byte activations, fp32 4-byte ones. */
  precision?: 'fp32' | 'bf16'
  /** The device's memory, bytes: whether the rank fits. */
  deviceBytes?: number
}

export interface MemoryPlan {
  model_type: string
  parameters: number
  shards: number
  optimizer: PlanOptimizer
  /** Tensors that stay whole on every rank (their first dimension does not split on chunk boundaries). */
  whole_tensors: string[]
  per_rank: {
    parameters: number
    gradients: number
    optimizer_state: number
    /** optimizer_state by part (bytes), as the module docstring lists them. */
    optimizer_state_parts: Record<string, number>
    activations: number
    transient: number
    total: number
  }
  device_bytes: number | null
  fits: boolean | null
}

/** Bytes per parameter held of each part of an optimizer's state (module docstring). */
export const STATE_BYTES: Record<PlanOptimizer, Record<string, number>> = {
  distro: {momentum: 4, committed: 4, signs: 1},
  sparseloco: {error_feedback: 4, inner_adamw_moments: 8, committed: 4, round_start: 4},
  adamw: {moments: 8},
}

interface Tensor {
  name: string
  shape: number[]
  /** The decoder layer it belongs to (one FSDP unit), or -1. */
  layer: number
}

function positive(config: ModelConfig, name: string, fallback?: number): number {
  const value = config[name] ?? fallback
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1) throw new PsycheError(`config.json: ${name} must be a positive integer, got ${JSON.stringify(value)}`)
  return value
}

function count(config: ModelConfig, name: string, fallback: number): number {
  const value = config[name] ?? fallback
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) throw new PsycheError(`config.json: ${name} must be a whole number, got ${JSON.stringify(value)}`)
  return value
}

/** The rows of one chunk of a dimension of `n` for a chunk limit: its largest divisor ≤ limit (python/psyche_worker/chunked.py). */
export function chunkRows(n: number, limit: number): number {
  if (n <= limit) return n
  for (let d = limit; d >= 1; d--) if (n % d === 0) return d
  return 1
}

/** The rows of a tensor's first dimension that one chunk spans (DisTrO's shard_rows, SparseLoCo's block_rows). */
function firstChunkRows(shape: number[], chunk: number): number {
  return shape.length <= 2 ? chunkRows(shape[0], chunk) : 1
}

function swiglu(prefix: string, layer: number, h: number, inter: number): Tensor[] {
  return [
    {name: `${prefix}.gate_proj.weight`, shape: [inter, h], layer},
    {name: `${prefix}.up_proj.weight`, shape: [inter, h], layer},
    {name: `${prefix}.down_proj.weight`, shape: [h, inter], layer},
  ]
}

function ends(config: ModelConfig, h: number, v: number): {head: Tensor[]; tail: Tensor[]} {
  const tail = [{name: 'model.norm.weight', shape: [h], layer: -1}]
  if (!config.tie_word_embeddings) tail.push({name: 'lm_head.weight', shape: [v, h], layer: -1})
  return {head: [{name: 'model.embed_tokens.weight', shape: [v, h], layer: -1}], tail}
}

/** Every parameter tensor of a Llama model, as transformers' LlamaForCausalLM holds them. */
function llamaTensors(config: ModelConfig): Tensor[] {
  const h = positive(config, 'hidden_size')
  const v = positive(config, 'vocab_size')
  const inter = positive(config, 'intermediate_size')
  const layers = positive(config, 'num_hidden_layers')
  const heads = positive(config, 'num_attention_heads')
  const kv = positive(config, 'num_key_value_heads', heads)
  const headDim = config.head_dim === undefined ? h / heads : positive(config, 'head_dim')
  if (!Number.isInteger(headDim)) throw new PsycheError(`config.json: hidden_size ${h} is not a multiple of num_attention_heads ${heads}`)
  const {head, tail} = ends(config, h, v)
  const tensors = [...head]
  for (let i = 0; i < layers; i++) {
    const p = `model.layers.${i}`
    tensors.push(
      {name: `${p}.self_attn.q_proj.weight`, shape: [heads * headDim, h], layer: i},
      {name: `${p}.self_attn.k_proj.weight`, shape: [kv * headDim, h], layer: i},
      {name: `${p}.self_attn.v_proj.weight`, shape: [kv * headDim, h], layer: i},
      {name: `${p}.self_attn.o_proj.weight`, shape: [h, heads * headDim], layer: i},
      ...swiglu(`${p}.mlp`, i, h, inter),
      {name: `${p}.input_layernorm.weight`, shape: [h], layer: i},
      {name: `${p}.post_attention_layernorm.weight`, shape: [h], layer: i},
    )
  }
  return [...tensors, ...tail]
}

/** Every parameter tensor of a DeepSeek-V3 model, as transformers 5's DeepseekV3ForCausalLM holds them: multi-head
 * latent attention, dense MLPs in the first `first_k_dense_replace` layers, then routed experts fused in two 3-D
 * tensors, a router and shared experts. */
function deepseekV3Tensors(config: ModelConfig): Tensor[] {
  const h = positive(config, 'hidden_size')
  const v = positive(config, 'vocab_size')
  const layers = positive(config, 'num_hidden_layers')
  const heads = positive(config, 'num_attention_heads')
  const qLora = config.q_lora_rank === null || config.q_lora_rank === undefined ? 0 : positive(config, 'q_lora_rank')
  const kvLora = positive(config, 'kv_lora_rank')
  const rope = positive(config, 'qk_rope_head_dim')
  const nope = positive(config, 'qk_nope_head_dim')
  const vHead = positive(config, 'v_head_dim')
  const dense = count(config, 'first_k_dense_replace', 0)
  const experts = positive(config, 'n_routed_experts')
  const shared = count(config, 'n_shared_experts', 0)
  const moeInter = positive(config, 'moe_intermediate_size')
  const inter = positive(config, 'intermediate_size')
  const qHead = nope + rope
  const {head, tail} = ends(config, h, v)
  const tensors = [...head]
  for (let i = 0; i < layers; i++) {
    const p = `model.layers.${i}`
    const a = `${p}.self_attn`
    if (qLora > 0)
      tensors.push(
        {name: `${a}.q_a_proj.weight`, shape: [qLora, h], layer: i},
        {name: `${a}.q_a_layernorm.weight`, shape: [qLora], layer: i},
        {name: `${a}.q_b_proj.weight`, shape: [heads * qHead, qLora], layer: i},
      )
    else tensors.push({name: `${a}.q_proj.weight`, shape: [heads * qHead, h], layer: i})
    tensors.push(
      {name: `${a}.kv_a_proj_with_mqa.weight`, shape: [kvLora + rope, h], layer: i},
      {name: `${a}.kv_a_layernorm.weight`, shape: [kvLora], layer: i},
      {name: `${a}.kv_b_proj.weight`, shape: [heads * (nope + vHead), kvLora], layer: i},
      {name: `${a}.o_proj.weight`, shape: [h, heads * vHead], layer: i},
    )
    if (i < dense) tensors.push(...swiglu(`${p}.mlp`, i, h, inter))
    else {
      tensors.push(
        {name: `${p}.mlp.experts.gate_up_proj`, shape: [experts, 2 * moeInter, h], layer: i},
        {name: `${p}.mlp.experts.down_proj`, shape: [experts, h, moeInter], layer: i},
        {name: `${p}.mlp.gate.weight`, shape: [experts, h], layer: i},
      )
      if (shared > 0) tensors.push(...swiglu(`${p}.mlp.shared_experts`, i, h, moeInter * shared))
    }
    tensors.push({name: `${p}.input_layernorm.weight`, shape: [h], layer: i}, {name: `${p}.post_attention_layernorm.weight`, shape: [h], layer: i})
  }
  return [...tensors, ...tail]
}

const FAMILIES: Record<string, (config: ModelConfig) => Tensor[]> = {llama: llamaTensors, deepseek_v3: deepseekV3Tensors}

/** The MLP width a token's activations go through in each layer: the dense one, or the routed experts it visits
 * (num_experts_per_tok) and the shared ones. */
function mlpWidths(config: ModelConfig): number[] {
  const layers = positive(config, 'num_hidden_layers')
  const inter = positive(config, 'intermediate_size')
  if (config.model_type !== 'deepseek_v3') return Array.from({length: layers}, () => inter)
  const dense = count(config, 'first_k_dense_replace', 0)
  const routed = positive(config, 'num_experts_per_tok') * positive(config, 'moe_intermediate_size')
  const shared = count(config, 'n_shared_experts', 0) * positive(config, 'moe_intermediate_size')
  return Array.from({length: layers}, (_, i) => (i < dense ? inter : routed + shared))
}

const product = (shape: number[]) => shape.reduce((a, b) => a * b, 1)

/** The memory one rank needs (module docstring). Activations: Korthikanti et al. (2022)'s 34·s·b·h bytes per layer
 * at 16 bits, without the attention scores (SDPA keeps none), of which the MLP's 19·s·b·h scale with its width
 * against a 4·h one (a MoE layer: the experts a token visits and the shared ones); doubled for fp32; plus the logits
 * and their gradient. Transient: one decoder layer's whole parameters and gradients (the largest FSDP unit) while
 * it runs, and the larger of one whole gradient (gathered for its norm) and, for SparseLoCo, producing the largest
 * tensor's result (two copies of its block, every rank's top-k values and indices). */
export function memoryPlan(config: ModelConfig, options: MemoryPlanOptions): MemoryPlan {
  const shards = options.shards
  if (!Number.isInteger(shards) || shards < 1) throw new PsycheError(`--devices must be a positive integer, got ${shards}`)
  const optimizer = options.optimizer ?? 'distro'
  if (optimizer === 'adamw' && shards > 1)
    throw new PsycheError(`--optimizer adamw with --devices ${shards}: AdamW does not train a sharded model (join --shard); use distro or sparseloco`)
  const modelType = config.model_type === undefined ? 'llama' : String(config.model_type)
  const family = FAMILIES[modelType]
  if (!family) throw new PsycheError(`config.json: model_type ${JSON.stringify(config.model_type)}: psyche plan knows ${Object.keys(FAMILIES).join(' and ')} models`)
  const chunk = options.chunk ?? 64
  const topk = options.topk ?? 64
  const tensors = family(config)
  const whole: string[] = []
  let held = 0
  let largestTensor = 0
  let largestBlock = 0
  let largestSelection = 0
  let total = 0
  const layerParameters = new Map<number, number>()
  for (const t of tensors) {
    const n = product(t.shape)
    total += n
    largestTensor = Math.max(largestTensor, n)
    const split = shards > 1 && t.shape[0] % (shards * firstChunkRows(t.shape, chunk)) === 0
    if (shards > 1 && !split) whole.push(t.name)
    const block = split ? n / shards : n
    held += block
    largestBlock = Math.max(largestBlock, block)
    // SparseLoCo's selection: top-k (at most a chunk's elements) of every chunk of the whole tensor
    const chunkElements = t.shape.length === 1 ? chunkRows(t.shape[0], chunk) : chunkRows(t.shape.at(-2)!, chunk) * chunkRows(t.shape.at(-1)!, chunk)
    largestSelection = Math.max(largestSelection, (n / chunkElements) * Math.min(topk, chunkElements))
    if (t.layer >= 0) layerParameters.set(t.layer, (layerParameters.get(t.layer) ?? 0) + n)
  }
  const h = positive(config, 'hidden_size')
  const vocab = positive(config, 'vocab_size')
  const activationBytes = options.precision === 'fp32' ? 2 : 1
  const tokens = options.seqLen * options.microBatch
  const activations = mlpWidths(config).reduce((sum, width) => sum + (15 * h + (19 * width) / 4) * tokens * activationBytes, 0) + 2 * 4 * tokens * vocab
  const largestUnit = Math.max(0, ...layerParameters.values())
  // produce (SparseLoCo): the block's chunks and their magnitudes (fp32), every rank's values (fp32) and indices (int64)
  const selection = optimizer === 'sparseloco' ? 2 * 4 * largestBlock + 12 * largestSelection : 0
  const transient = (shards > 1 ? 2 * 4 * largestUnit : 0) + Math.max(shards > 1 ? 4 * largestTensor : 0, selection)
  const parts = Object.fromEntries(Object.entries(STATE_BYTES[optimizer]).map(([name, bytes]) => [name, held * bytes]))
  const perRank = {
    parameters: held * 4,
    gradients: held * 4,
    optimizer_state: Object.values(parts).reduce((a, b) => a + b, 0),
    optimizer_state_parts: parts,
    activations,
    transient,
    total: 0,
  }
  perRank.total = perRank.parameters + perRank.gradients + perRank.optimizer_state + perRank.activations + perRank.transient
  const deviceBytes = options.deviceBytes ?? null
  return {
    model_type: modelType,
    parameters: total,
    shards,
    optimizer,
    whole_tensors: whole,
    per_rank: perRank,
    device_bytes: deviceBytes,
    fits: deviceBytes === null ? null : perRank.total <= deviceBytes,
  }
}
