import {stat} from 'node:fs/promises'
import {dirname, isAbsolute, resolve} from 'node:path'
import {LocalTokenDataset} from './local.js'
import {modelWeightProblems} from '../checkpoint/llama-layout.js'
import {errorMessage} from '../errors.js'
import {resolveConfigPath} from '../config/run-config-file.js'
import type {ConfigIssue, DataServerConfig, RunConfigFile} from '../config/types.js'

/**
 * The local paths a run config and its data.toml name, checked as `join` and `server run` will use them: a Local
 * data location and a data.toml's dir must open as token data (a directory of token files), a Local checkpoint
 * must be a model directory (config.json; weights are optional, a model without them starts from a random
 * initialization, but a model.safetensors must be the model config.json describes: its header is read and checked). `createdOnUse`: directories that are made on first use (the demo corpus), not checked.
 */
export async function checkLocalPaths(run: RunConfigFile, data: DataServerConfig | undefined, options: {createdOnUse?: string[]} = {}): Promise<ConfigIssue[]> {
  const issues: ConfigIssue[] = []
  const made = (dir: string) => (options.createdOnUse ?? []).some((root) => dir === root || dir.startsWith(`${root}/`))
  const tokens = async (file: string, path: string, value: string, dir: string) => {
    if (made(dir)) return
    try {
      const dataset = await LocalTokenDataset.open(dir)
      await dataset.close()
    } catch (error) {
      const exists = await stat(dir).catch(() => undefined)
      const message = !exists ? `does not exist (${dir})` : !exists.isDirectory() ? `is not a directory (${dir})` : errorMessage(error).replace(`${dir}: `, '')
      issues.push({file, path, value: JSON.stringify(value), message: `token data directory ${message}`})
    }
  }
  const llm = run.model.LLM
  if (typeof llm.data_location === 'object' && 'Local' in llm.data_location) {
    const value = llm.data_location.Local
    await tokens(run.path, 'model.LLM.data_location.Local', value, resolveConfigPath(run, value))
  }
  if (typeof llm.checkpoint === 'object' && 'Local' in llm.checkpoint) {
    const value = llm.checkpoint.Local.path
    const dir = resolveConfigPath(run, value)
    const where = {file: run.path, path: 'model.LLM.checkpoint.Local.path', value: JSON.stringify(value)}
    const found = await stat(dir).catch(() => undefined)
    if (!found) issues.push({...where, message: `model directory does not exist (${dir}); psyche model init --out ${dir} creates one`})
    else if (!found.isDirectory()) issues.push({...where, message: `is not a directory (${dir})`})
    else if (!(await stat(resolve(dir, 'config.json')).catch(() => undefined))) issues.push({...where, message: `is not a model directory: no config.json in ${dir}`})
    else for (const message of await modelWeightProblems(dir)) issues.push({...where, message})
  }
  if (data) await tokens(data.path, 'dir', data.dir, isAbsolute(data.dir) ? data.dir : resolve(dirname(data.path), data.dir))
  return issues
}
