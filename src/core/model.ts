import {existsSync} from 'node:fs'
import {join, resolve} from 'node:path'
import {PsycheError} from './errors.js'
import {readModelConfig, templateModelConfigPath} from './train/plan.js'
import {ModelWorker} from './worker/model-worker.js'

export interface CreatedModel {
  dir: string
  /** Where the model's config came from: a template name, or the config.json already in the directory. */
  template: string
  parameters: number
  paramHash: string
  seed: number
}

/**
 * A randomly initialised model written in Hugging Face layout (config.json + model.safetensors + tokenizer + card), from
 * templates/NAME/model/config.json, or — with no template named — from the config.json already in the
 * output directory (as `psyche init` scaffolds it). The same config and seed give the same bytes.
 */
export async function createModelFromTemplate(options: {
  template?: string
  out: string
  seed: number
  force?: boolean
  overrides?: Record<string, unknown>
  tokenizer?: string
}): Promise<CreatedModel> {
  const out = resolve(options.out)
  if (existsSync(join(out, 'model.safetensors')) && !options.force) {
    throw new PsycheError(`${options.out}: already holds a model (model.safetensors); use --force to replace it`)
  }
  const scaffolded = join(out, 'config.json')
  const fromDir = !options.template && existsSync(scaffolded)
  const template = options.template ?? (fromDir ? scaffolded : 'tiny-demo')
  const config = {...readModelConfig(fromDir ? scaffolded : templateModelConfigPath(template)), ...options.overrides}
  const worker = await ModelWorker.start({threads: 1, device: 'cpu'})
  try {
    const info = await worker.initFromConfig(config, options.seed)
    await worker.save(out, {tokenizer: options.tokenizer ?? (existsSync(join(out, 'tokenizer.json')) ? out : undefined), card: {seed: options.seed, template}})
    return {dir: out, template, parameters: info.parameters, paramHash: info.param_hash, seed: options.seed}
  } finally {
    await worker.shutdown()
  }
}
