import {PsycheError} from '../errors.js'

/**
 * What one rank of a client needs, from a Llama config alone (`psyche plan`): the bytes of its parameters, gradients
 * and DisTrO state when the model is held in `shards` shards (python/psyche_worker/sharding.py), and an estimate of
 * the activations of one micro-batch.
 *
 * The split rule is the worker's: a tensor is split into `shards` row blocks only when its first dimension is a
 * multiple of `shards` × the rows of one DisTrO chunk (the largest divisor ≤ the chunk); otherwise every rank holds it
 * whole. Per parameter: 4 bytes of fp32 weights, 4 of gradient, and DisTrO's 4 of momentum, 4 of the committed copy
 * (delay correction) and 1 of the speculation's signs.
 */
export interface LlamaShape {
  vocab_size: number
  hidden_size: number
  intermediate_size: number
  num_hidden_layers: number
  num_attention_heads: number
  num_key_value_heads?: number
  head_dim?: number
  tie_word_embeddings?: boolean
  max_position_embeddings?: number
}

interface MemoryPlanOptions {
  shards: number
  microBatch: number
  seqLen: number
  /** DisTrO's compression_chunk (default 64). */
  chunk?: number
  /** Forward precision: bf16 autocast keeps 2-byte activations, fp32 4-byte ones. */
  precision?: 'fp32' | 'bf16'
  /** The device's memory, bytes: whether the rank fits. */
  deviceBytes?: number
}

export interface MemoryPlan {
  parameters: number
  shards: number
  /** Tensors that stay whole on every rank (their first dimension does not split on chunk boundaries). */
  whole_tensors: string[]
  per_rank: {parameters: number; gradients: number; optimizer_state: number; activations: number; transient: number; total: number}
  device_bytes: number | null
  fits: boolean | null
}

const BYTES = {parameters: 4, gradients: 4, momentum: 4, committed: 4, signs: 1}

function positive(name: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1) throw new PsycheError(`config.json: ${name} must be a positive integer, got ${JSON.stringify(value)}`)
  return value
}

/** The rows of one chunk of a dimension of `n` for a chunk limit: its largest divisor ≤ limit (python/psyche_worker/chunked.py). */
export function chunkRows(n: number, limit: number): number {
  if (n <= limit) return n
  for (let d = limit; d >= 1; d--) if (n % d === 0) return d
  return 1
}

/** Every parameter tensor of a Llama model of this shape: name and shape, as transformers' LlamaForCausalLM holds them. */
function llamaTensors(config: LlamaShape): {name: string; shape: number[]}[] {
  const h = positive('hidden_size', config.hidden_size)
  const v = positive('vocab_size', config.vocab_size)
  const inter = positive('intermediate_size', config.intermediate_size)
  const layers = positive('num_hidden_layers', config.num_hidden_layers)
  const heads = positive('num_attention_heads', config.num_attention_heads)
  const kv = config.num_key_value_heads === undefined ? heads : positive('num_key_value_heads', config.num_key_value_heads)
  const headDim = config.head_dim === undefined ? h / heads : positive('head_dim', config.head_dim)
  if (!Number.isInteger(headDim)) throw new PsycheError(`config.json: hidden_size ${h} is not a multiple of num_attention_heads ${heads}`)
  const tensors = [{name: 'model.embed_tokens.weight', shape: [v, h]}]
  for (let i = 0; i < layers; i++) {
    const p = `model.layers.${i}`
    tensors.push(
      {name: `${p}.self_attn.q_proj.weight`, shape: [heads * headDim, h]},
      {name: `${p}.self_attn.k_proj.weight`, shape: [kv * headDim, h]},
      {name: `${p}.self_attn.v_proj.weight`, shape: [kv * headDim, h]},
      {name: `${p}.self_attn.o_proj.weight`, shape: [h, heads * headDim]},
      {name: `${p}.mlp.gate_proj.weight`, shape: [inter, h]},
      {name: `${p}.mlp.up_proj.weight`, shape: [inter, h]},
      {name: `${p}.mlp.down_proj.weight`, shape: [h, inter]},
      {name: `${p}.input_layernorm.weight`, shape: [h]},
      {name: `${p}.post_attention_layernorm.weight`, shape: [h]},
    )
  }
  tensors.push({name: 'model.norm.weight', shape: [h]})
  if (!config.tie_word_embeddings) tensors.push({name: 'lm_head.weight', shape: [v, h]})
  return tensors
}

/** The memory one rank needs (module docstring). Activations: Korthikanti et al. (2022)'s 34·s·b·h bytes per layer at
 * 16 bits, without the attention scores (SDPA keeps none), doubled for fp32; plus the logits and their gradient. */
export function memoryPlan(config: LlamaShape, options: MemoryPlanOptions): MemoryPlan {
  const shards = positive('--devices', options.shards)
  const chunk = options.chunk ?? 64
  const tensors = llamaTensors(config)
  const whole: string[] = []
  let held = 0
  let largestTensor = 0
  let total = 0
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1)
    total += n
    largestTensor = Math.max(largestTensor, n)
    const split = shards > 1 && t.shape[0] % (shards * chunkRows(t.shape[0], chunk)) === 0
    if (shards > 1 && !split) whole.push(t.name)
    held += split ? n / shards : n
  }
  const layerParameters = tensors.filter((t) => t.name.startsWith('model.layers.0.')).reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0)
  const activationBytes = options.precision === 'fp32' ? 2 : 1
  const rows = Math.ceil(options.microBatch)
  const perLayer = 34 * options.seqLen * rows * config.hidden_size * activationBytes
  const logits = 2 * 4 * options.seqLen * rows * config.vocab_size
  const activations = perLayer * config.num_hidden_layers + logits
  // gathered while it runs: one decoder layer's whole parameters (and its gradients in backward); one whole gradient for the norm
  const transient = shards > 1 ? 2 * 4 * layerParameters + 4 * largestTensor : 0
  const perRank = {
    parameters: held * BYTES.parameters,
    gradients: held * BYTES.gradients,
    optimizer_state: held * (BYTES.momentum + BYTES.committed + BYTES.signs),
    activations,
    transient,
    total: 0,
  }
  perRank.total = perRank.parameters + perRank.gradients + perRank.optimizer_state + perRank.activations + perRank.transient
  const deviceBytes = options.deviceBytes ?? null
  return {parameters: total, shards, whole_tensors: whole, per_rank: perRank, device_bytes: deviceBytes, fits: deviceBytes === null ? null : perRank.total <= deviceBytes}
}
