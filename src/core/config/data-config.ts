import {parse as parseToml, TomlError} from 'smol-toml'
import {readConfigText} from './file.js'
import {ConfigError, Reader, type Table} from './read.js'
import {LIMITS} from './run-config.js'
import type {ConfigIssue, DataServerConfig, RunConfigFile} from './types.js'

/** Parses and validates a TCP data server's `data.toml` (dir, token_size, seq_len, shuffle_seed). */
export function parseDataServerConfig(text: string, path: string): DataServerConfig {
  let root: Table
  try {
    root = parseToml(text) as Table
  } catch (error) {
    if (error instanceof TomlError)
      throw new ConfigError([{file: path, path: '', message: `not valid TOML at line ${error.line}, column ${error.column}: ${error.message.split('\n')[0]}`}])
    throw error
  }
  const r = new Reader(path)
  r.known(root, '', ['dir', 'token_size', 'seq_len', 'shuffle_seed'])
  const seed = root.shuffle_seed
  if (seed === undefined) r.issue('shuffle_seed', 'missing (expected 32 integers from 0 to 255)')
  else if (!Array.isArray(seed) || seed.length !== 32 || !seed.every((b) => Number.isInteger(b) && b >= 0 && b <= 255)) {
    r.issue('shuffle_seed', 'must be 32 integers from 0 to 255', seed)
  }
  const config: DataServerConfig = {
    path,
    dir: r.str(root, 'dir', '', {nonEmpty: true}),
    token_size: r.oneOf(root, 'token_size', '', ['TwoBytes', 'FourBytes']),
    seq_len: r.int(root, 'seq_len', '', {min: 1, max: LIMITS.seqLen}),
    shuffle_seed: Array.isArray(seed) ? (seed as number[]) : [],
  }
  r.done()
  return config
}

/** Reads and parses a `data.toml` (see parseDataServerConfig). */
export async function loadDataServerConfig(path: string): Promise<DataServerConfig> {
  return parseDataServerConfig(await readConfigText(path), path)
}

/**
 * Rules between a run config and the data server that feeds it: `errors` make the pair unusable,
 * `warnings` are worth telling (a data.toml no client will use).
 */
export function checkDataServerForRun(run: RunConfigFile, data: DataServerConfig): {errors: ConfigIssue[]; warnings: ConfigIssue[]} {
  const errors: ConfigIssue[] = []
  const warnings: ConfigIssue[] = []
  const llm = run.model.LLM
  if (typeof llm.data_location !== 'object' || !('Server' in llm.data_location)) {
    warnings.push({file: data.path, path: '', message: `unused: ${run.path} model.LLM.data_location is not Server, so no client asks a data server`})
  }
  if (data.seq_len !== llm.max_seq_len) {
    errors.push({
      file: data.path,
      path: 'seq_len',
      value: String(data.seq_len),
      message: `must equal ${run.path} model.LLM.max_seq_len (${llm.max_seq_len}): the server cuts samples of this length`,
    })
  }
  return {errors, warnings}
}
