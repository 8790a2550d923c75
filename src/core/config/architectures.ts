import {existsSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {resolveConfigPath} from './run-config-file.js'
import {ARCHITECTURE_MODEL_TYPES} from './support.js'
import type {ConfigIssue, LLMArchitecture, RunConfigFile} from './types.js'

/** The architectures the worker builds and what each runs, for help texts: "HfLlama: llama, ..., HfAuto: any causal LM transformers builds". */
export function describeArchitectures(): string {
  return Object.entries(ARCHITECTURE_MODEL_TYPES)
    .map(([name, types]) => `${name}: ${types === null ? 'any causal LM transformers builds' : types!.join(', ')}`)
    .join(', ')
}

/**
 * Why `architecture` cannot run a model with this config.json, or undefined when it can (as far as can be told
 * without transformers: HfAuto's model type is checked by the worker).
 */
export function architectureMismatch(architecture: LLMArchitecture, modelConfig: Record<string, unknown>): string | undefined {
  const modelType = modelConfig.model_type
  if (typeof modelType !== 'string' || modelType === '') return 'its config.json has no model_type (the transformers architecture, e.g. "llama" or "qwen3")'
  const types = ARCHITECTURE_MODEL_TYPES[architecture]
  if (types === undefined) return `the worker does not build ${architecture} models`
  if (types !== null && !types.includes(modelType)) {
    return `the model's config.json has model_type "${modelType}"; ${architecture} runs ${types.join(', ')} models (HfAuto runs any causal LM transformers builds)`
  }
  return undefined
}

/**
 * The local model directory a run config names, if any: a Local checkpoint, or a Hub/P2P repo_id that is a local
 * directory with a config.json (from_pretrained's rule, as `psyche train` and `join` use it).
 */
function localModelDir(run: RunConfigFile): {dir: string; field: string} | undefined {
  const checkpoint = run.model.LLM.checkpoint
  if (typeof checkpoint !== 'object') return undefined
  if ('Local' in checkpoint) return {dir: resolveConfigPath(run, checkpoint.Local.path), field: 'model.LLM.checkpoint.Local.path'}
  for (const variant of ['Hub', 'P2P'] as const) {
    const repo = (checkpoint as Record<string, {repo_id?: string} | undefined>)[variant]
    if (repo?.repo_id && existsSync(join(resolveConfigPath(run, repo.repo_id), 'config.json')))
      return {dir: resolveConfigPath(run, repo.repo_id), field: `model.LLM.checkpoint.${variant}.repo_id`}
  }
  return undefined
}

/**
 * model.LLM.architecture against the run's local model (its config.json's model_type): an issue naming the field
 * when our clients could not run it. A model that is not on this disk (a Hub repository) is checked when it loads.
 */
export function checkArchitecture(run: RunConfigFile): ConfigIssue[] {
  const architecture = run.model.LLM.architecture
  const local = localModelDir(run)
  const configPath = local && join(local.dir, 'config.json')
  if (!configPath || !existsSync(configPath)) return []
  const issue = (message: string): ConfigIssue => ({file: run.path, path: 'model.LLM.architecture', value: JSON.stringify(architecture), message})
  let modelConfig: unknown
  try {
    modelConfig = JSON.parse(readFileSync(configPath, 'utf8'))
  } catch (error) {
    return [issue(`the model's ${configPath} (${local.field}) is not valid JSON: ${(error as Error).message}`)]
  }
  if (typeof modelConfig !== 'object' || modelConfig === null || Array.isArray(modelConfig)) return [issue(`the model's ${configPath} (${local.field}) is not a JSON object`)]
  const why = architectureMismatch(architecture, modelConfig as Record<string, unknown>)
  return why ? [issue(`${why} (${configPath})`)] : []
}
