import {existsSync, readdirSync} from 'node:fs'
import {resolve} from 'node:path'
import {PsycheError} from './errors.js'
import {readModelConfig, templateModelConfigPath} from './train/plan.js'
import {ModelWorker} from './worker/model-worker.js'

export interface CreatedModel {
  dir: string
  template: string
  parameters: number
  paramHash: string
  seed: number
}

/**
 * A randomly initialised model from templates/NAME/model/config.json, written in Hugging Face layout
 * (config.json + model.safetensors). The same template and seed always give the same parameter bytes.
 */
export async function createModelFromTemplate(options: {template: string; out: string; seed: number; force?: boolean; overrides?: Record<string, unknown>}): Promise<CreatedModel> {
  const out = resolve(options.out)
  if (existsSync(out) && readdirSync(out).length > 0 && !options.force) {
    throw new PsycheError(`${options.out}: directory exists and is not empty (use --force to replace it)`)
  }
  const config = {...readModelConfig(templateModelConfigPath(options.template)), ...options.overrides}
  const worker = await ModelWorker.start({threads: 1, device: 'cpu'})
  try {
    const info = await worker.initFromConfig(config, options.seed)
    await worker.save(out)
    return {dir: out, template: options.template, parameters: info.parameters, paramHash: info.param_hash, seed: options.seed}
  } finally {
    await worker.shutdown()
  }
}
