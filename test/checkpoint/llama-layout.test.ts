import assert from 'node:assert/strict'
import {mkdirSync, readFileSync, truncateSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {modelWeightProblems} from '../../src/core/checkpoint/llama-layout.js'
import {tempDir} from '../helpers.js'

const CONFIG = {
  model_type: 'llama',
  vocab_size: 16,
  hidden_size: 8,
  intermediate_size: 12,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  tie_word_embeddings: false,
}

/** The tensors transformers' LlamaForCausalLM has for CONFIG (head_dim 4, one key/value head). */
function tensors(config = CONFIG): [string, number[]][] {
  const h = config.hidden_size
  const out: [string, number[]][] = [['model.embed_tokens.weight', [config.vocab_size, h]]]
  for (let i = 0; i < config.num_hidden_layers; i++) {
    const p = `model.layers.${i}.`
    out.push([`${p}self_attn.q_proj.weight`, [8, h]], [`${p}self_attn.k_proj.weight`, [4, h]], [`${p}self_attn.v_proj.weight`, [4, h]], [`${p}self_attn.o_proj.weight`, [h, 8]])
    out.push([`${p}mlp.gate_proj.weight`, [12, h]], [`${p}mlp.up_proj.weight`, [12, h]], [`${p}mlp.down_proj.weight`, [h, 12]])
    out.push([`${p}input_layernorm.weight`, [h]], [`${p}post_attention_layernorm.weight`, [h]])
  }
  out.push(['model.norm.weight', [h]])
  if (!config.tie_word_embeddings) out.push(['lm_head.weight', [config.vocab_size, h]])
  return out
}

/** A safetensors file of F32 zeros with these tensors, laid out as safetensors writes them. */
function safetensors(list: [string, number[]][]): Buffer {
  const header: Record<string, unknown> = {__metadata__: {format: 'pt'}}
  let offset = 0
  for (const [name, shape] of list) {
    const bytes = shape.reduce((a, b) => a * b, 1) * 4
    header[name] = {dtype: 'F32', shape, data_offsets: [offset, offset + bytes]}
    offset += bytes
  }
  const json = Buffer.from(JSON.stringify(header))
  const length = Buffer.alloc(8)
  length.writeBigUInt64LE(BigInt(json.length))
  return Buffer.concat([length, json, Buffer.alloc(offset)])
}

function modelDir(root: string, name: string, weights: Buffer | undefined, config: object = CONFIG): string {
  const dir = join(root, name)
  mkdirSync(dir)
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config))
  if (weights) writeFileSync(join(dir, 'model.safetensors'), weights)
  return dir
}

describe("a Local model's weights against its config.json (validate-config)", () => {
  it('the model config.json describes passes; so does a directory without weights (random initialization) and a tied lm_head left out', async () => {
    const dir = tempDir()
    try {
      assert.deepEqual(await modelWeightProblems(modelDir(dir.path, 'ok', safetensors(tensors()))), [])
      assert.deepEqual(await modelWeightProblems(modelDir(dir.path, 'none', undefined)), [])
      const tied = {...CONFIG, tie_word_embeddings: true}
      assert.deepEqual(await modelWeightProblems(modelDir(dir.path, 'tied', safetensors(tensors(tied)), tied)), [])
    } finally {
      dir.cleanup()
    }
  })

  it('a truncated file, a header that is not JSON, bytes past the end, a wrong shape, a missing or unknown tensor: each named', async () => {
    const dir = tempDir()
    try {
      const good = safetensors(tensors())
      const truncated = modelDir(dir.path, 'truncated', good)
      truncateSync(join(truncated, 'model.safetensors'), good.length - 100)
      assert.match((await modelWeightProblems(truncated)).join('\n'), /model\.safetensors: tensor lm_head\.weight lies outside the file/)

      const garbage = Buffer.from(good)
      garbage.write('not json', 8)
      assert.match((await modelWeightProblems(modelDir(dir.path, 'garbage', garbage))).join('\n'), /model\.safetensors: not a safetensors file \(header is not JSON\)/)

      assert.match((await modelWeightProblems(modelDir(dir.path, 'longer', Buffer.concat([good, Buffer.alloc(12)])))).join('\n'), /12 bytes past the last tensor/)

      const reshaped = tensors().map(([n, s]): [string, number[]] => (n === 'model.norm.weight' ? [n, [9]] : [n, s]))
      assert.match(
        (await modelWeightProblems(modelDir(dir.path, 'shape', safetensors(reshaped)))).join('\n'),
        /tensor model\.norm\.weight has shape \[9\], config\.json gives \[8\]/,
      )

      const fewer = tensors().filter(([n]) => !n.startsWith('model.layers.1.'))
      assert.match(
        (await modelWeightProblems(modelDir(dir.path, 'fewer', safetensors(fewer)))).join('\n'),
        /9 tensors of config\.json's model missing \(model\.layers\.1\.self_attn\.q_proj\.weight/,
      )

      const extra = [...tensors(), ['model.layers.2.input_layernorm.weight', [8]] as [string, number[]]]
      assert.match(
        (await modelWeightProblems(modelDir(dir.path, 'extra', safetensors(extra)))).join('\n'),
        /tensor model\.layers\.2\.input_layernorm\.weight is not a tensor of the llama model/,
      )

      // Another config.json for the same file: every shape that differs is named.
      const wider = modelDir(dir.path, 'wider', good, {...CONFIG, hidden_size: 16})
      assert.match((await modelWeightProblems(wider)).join('\n'), /model\.embed_tokens\.weight has shape \[16,8\], config\.json gives \[16,16\]/)
      assert.ok(readFileSync(join(wider, 'config.json'), 'utf8').includes('"hidden_size":16'))
    } finally {
      dir.cleanup()
    }
  })
})
