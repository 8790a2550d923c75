import {existsSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {PsycheError} from '../errors.js'

/** The repository root (where package.json, python/ and .venv/ live). */
export const projectRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')

/** The Python that runs workers: $PSYCHE_PYTHON, else the project's venv made by `npm run setup`. */
export function workerPython(): string {
  const fromEnv = process.env.PSYCHE_PYTHON
  if (fromEnv) return fromEnv
  const venv = join(projectRoot, '.venv', 'bin', 'python')
  if (!existsSync(venv)) {
    throw new PsycheError(`no Python environment at ${venv}: run \`npm run setup\` (or set PSYCHE_PYTHON to a Python with the packages in python/requirements.txt)`)
  }
  return venv
}

export function pythonEnv(extra: Record<string, string> = {}): Record<string, string> {
  const existing = process.env.PYTHONPATH
  return {
    PYTHONPATH: existing ? `${join(projectRoot, 'python')}:${existing}` : join(projectRoot, 'python'),
    PYTHONUNBUFFERED: '1',
    // the worker runs offline: never let transformers / huggingface_hub reach for the network
    HF_HUB_OFFLINE: '1',
    TRANSFORMERS_OFFLINE: '1',
    TRANSFORMERS_VERBOSITY: 'error',
    ...extra,
  }
}
