import {cp, mkdir, readFile, readdir, stat, writeFile} from 'node:fs/promises'
import {dirname, isAbsolute, join, relative, resolve} from 'node:path'
import {fileURLToPath} from 'node:url'
import {PsycheError} from '../errors.js'
import {loadRunConfigFile, parseRunConfig, resolveConfigPath} from './run-config-file.js'
import {parseDataServerConfig} from './data-config.js'

/** The project's templates/ folder: each run template has state.toml, optional data.toml, and model/. */
const TEMPLATES_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'templates')

interface ScaffoldOptions {
  template: string
  dir: string
  /** Replaces run_id in state.toml. */
  runId?: string
  /** Allows writing into a non-empty directory. */
  force?: boolean
  /** Sets init_min_clients (the clients every epoch waits for before it starts); min_clients is lowered to it if above. */
  minClients?: number
  templatesDir?: string
}

export interface ScaffoldResult {
  dir: string
  template: string
  run_id: string | undefined
  files: string[]
  /** Paths in the copied configs that were rewritten to keep pointing where they did in the template. */
  rewritten: {file: string; from: string; to: string}[]
  /** The model directory that still needs weights (`psyche model init`), if the checkpoint is Local. */
  model_dir: string | undefined
  model_has_weights: boolean
}

async function exists(path: string): Promise<boolean> {
  return (await stat(path).catch(() => undefined)) !== undefined
}

/** Template names that are run templates (have a state.toml). */
async function runTemplates(templatesDir = TEMPLATES_DIR): Promise<string[]> {
  const names = await readdir(templatesDir).catch(() => [] as string[])
  const out: string[] = []
  for (const name of names.sort()) if (await exists(join(templatesDir, name, 'state.toml'))) out.push(name)
  return out
}

/**
 * Replaces a string value in TOML text, keeping comments and layout. The value must appear exactly
 * once as a basic string; JSON string syntax is valid TOML basic-string syntax.
 */
function replaceTomlString(text: string, from: string, to: string, file: string): string {
  const literal = JSON.stringify(from)
  const first = text.indexOf(literal)
  if (first < 0 || text.indexOf(literal, first + 1) >= 0) throw new PsycheError(`${file}: cannot rewrite path ${literal}: it must appear exactly once as a "double-quoted" string`)
  return text.slice(0, first) + JSON.stringify(to) + text.slice(first + literal.length)
}

/** Replaces the integer value of `key = N` in TOML text (the first such line), keeping comments and layout. */
function replaceTomlInt(text: string, key: string, value: number, file: string): string {
  const line = new RegExp(`^(${key}\\s*=\\s*)(\\d+)`, 'm')
  if (!line.test(text)) throw new PsycheError(`${file}: has no ${key} = N line to set`)
  return text.replace(line, `$1${value}`)
}

/** A path of the template that points outside it must keep pointing at the same place from the new directory. */
function relocate(templateDir: string, p: string): string | undefined {
  if (isAbsolute(p)) return undefined
  const target = resolve(templateDir, p)
  const inside = !relative(templateDir, target).startsWith('..')
  return inside ? undefined : target
}

/**
 * Copies templates/NAME into `dir` (state.toml, data.toml, model/), rewriting relative paths that
 * lead outside the template so they still work from `dir`. Does not create model weights.
 */
export async function scaffoldRun(options: ScaffoldOptions): Promise<ScaffoldResult> {
  const templatesDir = options.templatesDir ?? TEMPLATES_DIR
  const templateDir = join(templatesDir, options.template)
  const available = await runTemplates(templatesDir)
  if (!(await exists(join(templateDir, 'state.toml')))) {
    const hint = (await exists(templateDir)) ? `it has no state.toml (a model-only template: use psyche model init --template ${options.template})` : 'no such template'
    throw new PsycheError(`--template ${options.template}: ${hint}; run templates: ${available.join(', ') || 'none'}`)
  }
  const dir = resolve(options.dir)
  if ((await exists(dir)) && !options.force) {
    const entries = await readdir(dir).catch(() => {
      throw new PsycheError(`${options.dir}: exists and is not a directory`)
    })
    if (entries.length > 0) throw new PsycheError(`${options.dir}: directory is not empty (use --force to write into it)`)
  }

  const statePath = join(templateDir, 'state.toml')
  let stateText = await readFile(statePath, 'utf8')
  const template = parseRunConfig(stateText, statePath)
  const rewritten: ScaffoldResult['rewritten'] = []
  const llm = template.model.LLM
  const localPaths: string[] = []
  if (typeof llm.data_location === 'object' && 'Local' in llm.data_location) localPaths.push(llm.data_location.Local)
  if (typeof llm.checkpoint === 'object' && 'Local' in llm.checkpoint) localPaths.push(llm.checkpoint.Local.path)
  for (const p of localPaths) {
    const target = relocate(templateDir, p)
    if (target) {
      stateText = replaceTomlString(stateText, p, target, statePath)
      rewritten.push({file: 'state.toml', from: p, to: target})
    }
  }
  if (options.runId !== undefined) {
    if (template.run_id === undefined) throw new PsycheError(`${statePath}: has no run_id to replace`)
    stateText = replaceTomlString(stateText, template.run_id, options.runId, statePath)
  }

  if (options.minClients !== undefined) {
    if (!Number.isInteger(options.minClients) || options.minClients < 1) throw new PsycheError(`--min-clients ${options.minClients}: must be a whole number ≥ 1`)
    stateText = replaceTomlInt(stateText, 'init_min_clients', options.minClients, statePath)
    if ((template.config?.min_clients ?? 0) > options.minClients) stateText = replaceTomlInt(stateText, 'min_clients', options.minClients, statePath)
    parseRunConfig(stateText, join(dir, 'state.toml')) // e.g. more clients than the first batch has sequences: refused before writing
  }

  await mkdir(dir, {recursive: true})
  const files: string[] = []
  const outState = join(dir, 'state.toml')
  await writeFile(outState, stateText)
  files.push('state.toml')

  const dataPath = join(templateDir, 'data.toml')
  if (await exists(dataPath)) {
    let dataText = await readFile(dataPath, 'utf8')
    const data = parseDataServerConfig(dataText, dataPath)
    const target = relocate(templateDir, data.dir)
    if (target) {
      dataText = replaceTomlString(dataText, data.dir, target, dataPath)
      rewritten.push({file: 'data.toml', from: data.dir, to: target})
    }
    await writeFile(join(dir, 'data.toml'), dataText)
    files.push('data.toml')
  }

  const modelDir = join(templateDir, 'model')
  if (await exists(modelDir)) {
    await cp(modelDir, join(dir, 'model'), {recursive: true, force: true})
    for (const name of await readdir(join(dir, 'model'))) files.push(`model/${name}`)
  }

  // The result must load from its new place (a broken template fails here, not at `server run`).
  const result = await loadRunConfigFile(outState)
  const checkpoint = result.model.LLM.checkpoint
  const model_dir = typeof checkpoint === 'object' && 'Local' in checkpoint ? resolveConfigPath(result, checkpoint.Local.path) : undefined
  const weights = model_dir ? (await readdir(model_dir).catch(() => [] as string[])).some((n) => n.endsWith('.safetensors') || n.endsWith('.bin')) : false
  return {dir, template: options.template, run_id: result.run_id, files, rewritten, model_dir, model_has_weights: weights}
}
