import {dirname, isAbsolute, resolve} from 'node:path'
import {parse as parseToml, TomlError} from 'smol-toml'
import {readConfigText} from './file.js'
import {ConfigError, Reader, type Table} from './read.js'
import {MAX_RUN_ID_BYTES, STARTING_RUN_STATES, readRunSections} from './run-config.js'
import type {RunConfigFile, RunState} from './types.js'

/**
 * Parses and validates a run configuration: a server `state.toml` or an `update-config` `config.toml`.
 * `path` names the file in errors and anchors relative paths. Throws a ConfigError listing every problem.
 */
export function parseRunConfig(text: string, path: string): RunConfigFile {
  let root: Table
  try {
    root = parseToml(text) as Table
  } catch (error) {
    if (error instanceof TomlError) {
      throw new ConfigError([{file: path, path: '', message: `not valid TOML at line ${error.line}, column ${error.column}: ${error.message.split('\n')[0]}`}])
    }
    throw error
  }
  const r = new Reader(path)
  r.known(root, '', ['run_id', 'run_state', 'config', 'model'])
  const file: Partial<RunConfigFile> = {path}
  if (root.run_id !== undefined) file.run_id = r.str(root, 'run_id', '', {nonEmpty: true, maxBytes: MAX_RUN_ID_BYTES})
  if (root.run_state !== undefined) {
    const state = root.run_state
    if (typeof state !== 'string' || !STARTING_RUN_STATES.includes(state as RunState)) {
      r.issue('run_state', `must be one of: ${STARTING_RUN_STATES.join(', ')} (a file starts a run before its first epoch)`, state)
    }
    file.run_state = state as RunState
  }
  if (file.run_state !== undefined && file.run_id === undefined) r.issue('run_id', 'missing: a server state file with run_state needs a run_id')
  const sections = readRunSections(r, root)
  r.done()
  return {...file, ...sections!} as RunConfigFile
}

/** Reads and parses a run configuration file (see parseRunConfig). */
export async function loadRunConfigFile(path: string): Promise<RunConfigFile> {
  return parseRunConfig(await readConfigText(path), path)
}

/**
 * Resolves a path written inside a config file (a `Local` data location or checkpoint) against the
 * file's directory — our extension; Psyche resolves against the process's working directory.
 */
export function resolveConfigPath(file: Pick<RunConfigFile, 'path'>, p: string): string {
  return isAbsolute(p) ? p : resolve(dirname(file.path), p)
}
