import {existsSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {errorMessage} from '../errors.js'
import {readSafetensorsHeader} from './safetensors.js'

/** Bytes per element of the safetensors dtypes a model may hold. */
const DTYPE_BYTES: Record<string, number> = {F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, BOOL: 1}

/**
 * The tensors (name → shape) of a LlamaForCausalLM with this config.json, as transformers names them: the one
 * architecture the worker builds (python/psyche_worker/model.py _llama_from_config), which loads model.safetensors
 * and refuses a file whose tensors differ. lm_head.weight is optional when the embeddings are tied.
 */
function llamaTensors(config: Record<string, unknown>): {expected: Map<string, number[]>; optional: Set<string>} {
  const n = (key: string, fallback?: number): number => {
    const v = config[key] ?? fallback
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v <= 0) throw new Error(`config.json: ${key} must be a positive whole number (it is ${JSON.stringify(config[key])})`)
    return v
  }
  const vocab = n('vocab_size')
  const hidden = n('hidden_size')
  const inter = n('intermediate_size')
  const layers = n('num_hidden_layers')
  const heads = n('num_attention_heads')
  const kvHeads = n('num_key_value_heads', heads)
  const headDim = n('head_dim', Math.floor(hidden / heads))
  const expected = new Map<string, number[]>([['model.embed_tokens.weight', [vocab, hidden]]])
  for (let i = 0; i < layers; i++) {
    const p = `model.layers.${i}.`
    expected.set(`${p}self_attn.q_proj.weight`, [heads * headDim, hidden])
    expected.set(`${p}self_attn.k_proj.weight`, [kvHeads * headDim, hidden])
    expected.set(`${p}self_attn.v_proj.weight`, [kvHeads * headDim, hidden])
    expected.set(`${p}self_attn.o_proj.weight`, [hidden, heads * headDim])
    if (config.attention_bias === true) {
      expected.set(`${p}self_attn.q_proj.bias`, [heads * headDim])
      expected.set(`${p}self_attn.k_proj.bias`, [kvHeads * headDim])
      expected.set(`${p}self_attn.v_proj.bias`, [kvHeads * headDim])
      expected.set(`${p}self_attn.o_proj.bias`, [hidden])
    }
    expected.set(`${p}mlp.gate_proj.weight`, [inter, hidden])
    expected.set(`${p}mlp.up_proj.weight`, [inter, hidden])
    expected.set(`${p}mlp.down_proj.weight`, [hidden, inter])
    if (config.mlp_bias === true) {
      expected.set(`${p}mlp.gate_proj.bias`, [inter])
      expected.set(`${p}mlp.up_proj.bias`, [inter])
      expected.set(`${p}mlp.down_proj.bias`, [hidden])
    }
    expected.set(`${p}input_layernorm.weight`, [hidden])
    expected.set(`${p}post_attention_layernorm.weight`, [hidden])
  }
  expected.set('model.norm.weight', [hidden])
  expected.set('lm_head.weight', [vocab, hidden])
  return {expected, optional: new Set(config.tie_word_embeddings === true ? ['lm_head.weight'] : [])}
}

/**
 * What is wrong with a model directory's weights (model.safetensors) against its config.json, as the worker would
 * find when it loads them: a header that does not parse, a tensor outside the file or of the wrong byte size, bytes
 * past the last tensor, and for llama a tensor missing, unexpected or of another shape than config.json gives. Empty: they fit
 * (or there is no model.safetensors: the model starts from a random initialization).
 */
export async function modelWeightProblems(dir: string): Promise<string[]> {
  const weights = join(dir, 'model.safetensors')
  if (!existsSync(weights)) return []
  let config: Record<string, unknown>
  try {
    config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'))
  } catch (error) {
    return [`${join(dir, 'config.json')}: cannot read: ${errorMessage(error)}`]
  }
  let header: Awaited<ReturnType<typeof readSafetensorsHeader>>
  try {
    header = await readSafetensorsHeader(weights)
  } catch (error) {
    return [errorMessage(error)]
  }
  // The tensors' names and shapes are checked for llama (the architecture the worker builds); the file's layout for any.
  let layout: ReturnType<typeof llamaTensors> | undefined
  try {
    if ((config.model_type ?? 'llama') === 'llama') layout = llamaTensors(config)
  } catch (error) {
    return [`${join(dir, 'config.json')}: ${errorMessage(error).replace(/^config\.json: /, '')}`]
  }
  const problems: string[] = []
  let end = header.dataStart
  for (const t of header.tensors) {
    const size = DTYPE_BYTES[t.dtype]
    if (size === undefined) problems.push(`${weights}: tensor ${t.name} has dtype ${t.dtype}, not a number type`)
    else if (!t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) problems.push(`${weights}: tensor ${t.name} has shape ${JSON.stringify(t.shape)}`)
    else if (t.shape.reduce((a, b) => a * b, 1) * size !== t.end - t.start)
      problems.push(
        `${weights}: tensor ${t.name} holds ${t.end - t.start} bytes, its shape ${JSON.stringify(t.shape)} of ${t.dtype} needs ${t.shape.reduce((a, b) => a * b, 1) * size}`,
      )
    if (t.start !== end) problems.push(`${weights}: tensor ${t.name} does not start where the previous one ends (byte ${t.start}, not ${end})`)
    end = Math.max(end, t.end)
    if (!layout) continue
    const want = layout.expected.get(t.name)
    if (!want) problems.push(`${weights}: tensor ${t.name} is not a tensor of the llama model config.json describes`)
    else if (JSON.stringify(want) !== JSON.stringify(t.shape))
      problems.push(`${weights}: tensor ${t.name} has shape ${JSON.stringify(t.shape)}, config.json gives ${JSON.stringify(want)}`)
  }
  if (end !== header.size) problems.push(`${weights}: ${header.size - end} bytes past the last tensor (the file is ${header.size} bytes)`)
  if (!layout) return problems.slice(0, 8)
  const present = new Set(header.tensors.map((t) => t.name))
  const missing = [...layout.expected.keys()].filter((name) => !present.has(name) && !layout.optional.has(name))
  if (missing.length > 0)
    problems.push(
      `${weights}: ${missing.length} tensor${missing.length === 1 ? '' : 's'} of config.json's model missing (${missing.slice(0, 4).join(', ')}${missing.length > 4 ? ', …' : ''})`,
    )
  return problems.slice(0, 8)
}
