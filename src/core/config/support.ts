import {readFileSync} from 'node:fs'
import {fileURLToPath} from 'node:url'
import {PsycheError} from '../errors.js'
import {DEFAULT_VERIFICATION_SAMPLE} from './run-config.js'
import type {LLMArchitecture, LLMDataType, RunConfigFile} from './types.js'

/**
 * THE table of what our clients can run, by the name Psyche's config format gives it: `server validate-config`
 * reports an unsupported entry as an error naming the field, `psyche train` refuses it, and the data providers
 * (src/core/data/index.ts) and the train plan read the same rows. To support something, implement it and flip its
 * row here (an architecture: add it to python/psyche_worker/architectures.json, which the worker reads too); nothing
 * else decides.
 */
type Support = {supported: true} | {supported: false; reason: string}

const yes: Support = {supported: true}
const no = (reason: string): Support => ({supported: false, reason})

/**
 * The file that decides which architectures our clients run: Psyche's architecture name -> the transformers model
 * types (a model's config.json `model_type`) it builds, `null` for any causal language model that transformers'
 * AutoModelForCausalLM builds. The worker reads the same file (python/psyche_worker/model.py ARCHITECTURES) and
 * reports it in its hello; test/config/architectures.test.ts and test/worker/architectures.test.ts check that both
 * sides read it.
 */
export const ARCHITECTURES_FILE = fileURLToPath(new URL('../../../python/psyche_worker/architectures.json', import.meta.url))

/** The architectures file at `path`, its shape checked (an error names the file). */
export function readArchitectures(path: string): Partial<Record<LLMArchitecture, readonly string[] | null>> {
  let table: unknown
  try {
    table = JSON.parse(readFileSync(path, 'utf8'))
  } catch (error) {
    throw new PsycheError(`${path}: the table of supported architectures cannot be read: ${(error as Error).message}`)
  }
  if (typeof table !== 'object' || table === null || Array.isArray(table)) throw new PsycheError(`${path}: expected an object of architecture names`)
  for (const [name, types] of Object.entries(table)) {
    const list = Array.isArray(types) && types.length > 0 && types.every((t) => typeof t === 'string' && t !== '')
    if (types !== null && !list) throw new PsycheError(`${path}: ${name}: expected null (any causal LM) or a non-empty list of model types`)
  }
  return table as Partial<Record<LLMArchitecture, readonly string[] | null>>
}

/**
 * The transformers model types each architecture runs, as the worker builds them: a list (HfLlama: llama,
 * HfDeepseek: deepseek_v3), `null` for any causal LM (HfAuto), absent for an architecture the worker does not build.
 * src/core/config/architectures.ts checks a model against it.
 */
export const ARCHITECTURE_MODEL_TYPES: Readonly<Partial<Record<LLMArchitecture, readonly string[] | null>>> = readArchitectures(ARCHITECTURES_FILE)

const built = (name: LLMArchitecture): Support =>
  ARCHITECTURE_MODEL_TYPES[name] !== undefined ? yes : no(`the worker does not build ${name} models (python/psyche_worker/architectures.json)`)

/** `model.LLM.architecture`: the model families the worker builds (the architectures file above). */
export const ARCHITECTURES: Record<LLMArchitecture, Support> = {
  HfLlama: built('HfLlama'),
  HfDeepseek: built('HfDeepseek'),
  HfAuto: built('HfAuto'),
}

/** The variants of `model.LLM.data_location`. */
export type DataLocationKind = 'Local' | 'Server' | 'Http' | 'WeightedHttp' | 'Preprocessed' | 'Dummy'

export const DATA_LOCATIONS: Record<DataLocationKind, Support> = {
  Local: yes,
  Server: yes,
  Http: yes,
  WeightedHttp: yes,
  Preprocessed: yes,
  Dummy: no("Dummy is Psyche's test placeholder: there is no data to train on"),
}

/** The variants of `model.LLM.data_location.Http.location` (a WeightedHttp mixture's entries too). */
export type HttpLocationKind = 'SingleUrl' | 'NumberedFiles' | 'Gcp'

export const HTTP_LOCATIONS: Record<HttpLocationKind, Support> = {
  SingleUrl: yes,
  NumberedFiles: yes,
  Gcp: yes,
}

/**
 * `model.LLM.data_type`. Finetuning trains on examples with loss masks (only the masked-in tokens count), which
 * only Preprocessed data carries: a token stream has none.
 */
const DATA_TYPES: Record<LLMDataType, Support> = {
  Pretraining: yes,
  Finetuning: yes,
}

/** The data locations that carry loss masks, as Finetuning needs. */
const LOSS_MASKED_LOCATIONS: readonly DataLocationKind[] = ['Preprocessed']

/** Why `dataType` cannot train on `location`, if it cannot: Finetuning needs data with loss masks. */
export function dataTypeProblem(dataType: LLMDataType, location: unknown): string | undefined {
  const kind = dataLocationKind(location) as DataLocationKind
  if (dataType !== 'Finetuning' || LOSS_MASKED_LOCATIONS.includes(kind)) return undefined
  return `Finetuning trains on examples with loss masks, which only ${LOSS_MASKED_LOCATIONS.join(', ')} data carries; data_location ${kind} is a token stream without them`
}

/** Columns of a Preprocessed dataset besides `inputs` and `labels` (Psyche's packed sequences). */
export const PREPROCESSED_COLUMNS: Record<'position_ids' | 'sequence_lengths', Support> = {
  position_ids: no('packed sequences (position_ids) need attention masked per packed example, which the worker does not do'),
  sequence_lengths: no('packed sequences (sequence_lengths) need attention masked per packed example, which the worker does not do'),
}

/** Checkpoint variants. */
export const CHECKPOINTS: Record<'Gcs' | 'P2PGcs', Support> = {
  Gcs: no('Google Cloud Storage checkpoints are not supported (no GCS credentials support); use Hub, P2P or Local'),
  P2PGcs: no('Google Cloud Storage checkpoints are not supported (no GCS credentials support); use Hub, P2P or Local'),
}

/** A part of a valid Psyche config that our clients cannot run, and why. */
export interface UnsupportedFeature {
  path: string
  reason: string
}

function variantOf(value: unknown): string {
  return typeof value === 'string' ? value : Object.keys(value ?? {})[0]
}

/** Which variant of `data_location` a location is (a string for unit variants, the single key otherwise). */
function dataLocationKind(location: unknown): string {
  return variantOf(location)
}

/**
 * Every part of a run config that the table marks unsupported, with the field path and the reason. An empty list
 * means our clients can run it.
 */
export function unsupportedFeatures(file: RunConfigFile): UnsupportedFeature[] {
  const out: UnsupportedFeature[] = []
  const llm = file.model.LLM
  const check = (support: Support | undefined, path: string, fallback: string) => {
    if (support === undefined) out.push({path, reason: fallback})
    else if (!support.supported) out.push({path, reason: support.reason})
  }
  check(ARCHITECTURES[llm.architecture], 'model.LLM.architecture', `unknown architecture ${llm.architecture}`)
  const checkpoint = variantOf(llm.checkpoint)
  if (checkpoint in CHECKPOINTS) check(CHECKPOINTS[checkpoint as keyof typeof CHECKPOINTS], `model.LLM.checkpoint.${checkpoint}`, '')
  const data = llm.data_location
  const kind = dataLocationKind(data) as DataLocationKind
  check(DATA_LOCATIONS[kind], typeof data === 'string' ? 'model.LLM.data_location' : `model.LLM.data_location.${kind}`, `unknown data location ${kind}`)
  if (typeof data === 'object' && 'Http' in data) {
    const http = variantOf(data.Http.location) as HttpLocationKind
    check(HTTP_LOCATIONS[http], `model.LLM.data_location.Http.location.${http}`, `unknown HTTP location ${http}`)
  }
  check(DATA_TYPES[llm.data_type], 'model.LLM.data_type', `unknown data type ${llm.data_type}`)
  const mismatch = dataTypeProblem(llm.data_type, data)
  if (mismatch) out.push({path: 'model.LLM.data_type', reason: mismatch})
  if (llm.optimizer === 'Dummy') out.push({path: 'model.LLM.optimizer', reason: "Dummy is Psyche's test placeholder: there is no optimizer to train with"})
  return out
}

/**
 * What the Solana coordinator program (programs/coordinator) cannot run of a config the centralized server runs, with
 * the field path and the reason. create-run and update-config refuse such a file before anything is sent, and
 * `psyche testnet --backend solana` before anything starts. To support something, implement it in the program and
 * drop its check here. (SparseLoCo's inner steps are supported: the account holds them, layout version 9.)
 */
export function programUnsupported(file: RunConfigFile): UnsupportedFeature[] {
  const out: UnsupportedFeature[] = []
  const sample = file.config?.verification_sample
  if (sample !== undefined && sample !== DEFAULT_VERIFICATION_SAMPLE) {
    // The coordinator account has no field for it (src/core/backend/solana/layout.ts encodeUpdate refuses it too).
    out.push({
      path: 'config.verification_sample',
      reason: `${sample}, but the Solana program does not store it: its runs score the default ${DEFAULT_VERIFICATION_SAMPLE} results per verifier; leave it out, or run on the centralized server`,
    })
  }
  return out
}

/** The error a Solana command gives for what the program cannot run of `file` (programUnsupported): every field, named. */
export function programRefusal(file: string, unsupported: UnsupportedFeature[]): string {
  return unsupported.map((u) => `${file}: ${u.path}: ${u.reason}`).join('\n')
}
