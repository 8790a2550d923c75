import {existsSync} from 'node:fs'
import {readFile} from 'node:fs/promises'
import {dirname, join, resolve} from 'node:path'
import {loadRunConfigFile, resolveConfigPath} from './config/index.js'
import {demoCorpusDir, ensureDemoCorpus} from './corpus.js'
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
  /** The tokenizer saved with the model: a tokenizer.json path, or 'byte-level' when none matched. */
  tokenizer: string
}

/**
 * The tokenizer.json a token data directory's manifest names (the one its tokens were made with), when it exists and
 * its vocabulary fits the model's; else undefined.
 */
export async function manifestTokenizer(dataDir: string, vocabSize?: number): Promise<string | undefined> {
  try {
    const manifest = JSON.parse(await readFile(join(dataDir, 'manifest.json'), 'utf8')) as {tokenizer?: unknown; vocab_size?: unknown}
    if (typeof manifest.tokenizer !== 'string') return undefined
    if (vocabSize !== undefined && typeof manifest.vocab_size === 'number' && manifest.vocab_size > vocabSize) return undefined
    const path = resolve(dataDir, manifest.tokenizer)
    return existsSync(path) ? path : undefined
  } catch {
    return undefined
  }
}

/**
 * The tokenizer of the run a model is made for: the run is the template's state.toml, or the state.toml beside the
 * model directory (as `psyche init` scaffolds it); its Local data's manifest names the tokenizer its tokens were
 * made with (the demo corpus is built first if it is the run's data). Undefined when there is no such run or data.
 */
async function runTokenizer(template: string | undefined, out: string, vocabSize: number | undefined): Promise<string | undefined> {
  const candidates = [template ? join(templateModelConfigPath(template), '..', '..', 'state.toml') : undefined, join(dirname(out), 'state.toml')]
  const statePath = candidates.find((p): p is string => p !== undefined && existsSync(p))
  if (!statePath) return undefined
  const run = await loadRunConfigFile(statePath).catch(() => undefined)
  const location = run?.model.LLM.data_location
  if (!run || typeof location !== 'object' || !('Local' in location)) return undefined
  const dataDir = resolveConfigPath(run, location.Local)
  if (dataDir === demoCorpusDir || dataDir.startsWith(`${demoCorpusDir}/`)) await ensureDemoCorpus()
  return manifestTokenizer(dataDir, vocabSize)
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
  // The tokenizer: as given, else one already in the directory, else the one the run's data was tokenized with (the
  // tiny-demo model's vocab of 4096 is the demo corpus's BPE), else a byte-level one.
  const vocabSize = typeof config.vocab_size === 'number' ? config.vocab_size : undefined
  const tokenizer =
    options.tokenizer ??
    (existsSync(join(out, 'tokenizer.json')) ? join(out, 'tokenizer.json') : await runTokenizer(options.template ?? (fromDir ? undefined : template), out, vocabSize))
  const worker = await ModelWorker.start({threads: 1, device: 'cpu'})
  try {
    const info = await worker.initFromConfig(config, options.seed)
    await worker.save(out, {tokenizer, card: {seed: options.seed, template}})
    return {dir: out, template, parameters: info.parameters, paramHash: info.param_hash, seed: options.seed, tokenizer: tokenizer ?? 'byte-level'}
  } finally {
    await worker.shutdown()
  }
}
