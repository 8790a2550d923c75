import {createInterface} from 'node:readline'
import {execa} from 'execa'
import {PsycheError} from '../errors.js'
import {parseJsonLine} from '../json-lines.js'
import {pythonEnv, workerPython} from '../worker/python.js'
import type {TokenManifest} from './local.js'
import type {TokenSize} from './token-file.js'

interface TokenizeOptions {
  inputs: readonly string[]
  tokenizer: string
  out: string
  tokenSize: TokenSize
  textField?: string
  eosToken?: string
  noEos?: boolean
  shardTokens?: number
  force?: boolean
  onProgress?: (progress: {file: string; bytesDone: number; bytesTotal: number; tokens: number}) => void
}

export type TokenizeResult = TokenManifest & {dir: string; seconds: number}

/**
 * Runs `python -m psyche_worker.tokenize_files` (Hugging Face `tokenizers` lives in Python) and relays its
 * JSON progress lines; its error events become one-line PsycheErrors.
 */
export async function tokenizeFiles(options: TokenizeOptions): Promise<TokenizeResult> {
  const args = ['-m', 'psyche_worker.tokenize_files', ...options.inputs, '--tokenizer', options.tokenizer, '--out', options.out, '--token-size', String(options.tokenSize)]
  if (options.textField) args.push('--text-field', options.textField)
  if (options.eosToken) args.push('--eos-token', options.eosToken)
  if (options.noEos) args.push('--no-eos')
  if (options.shardTokens) args.push('--shard-tokens', String(options.shardTokens))
  if (options.force) args.push('--force')
  // Two threads at most: tokenizing shares the machine with training.
  const child = execa(workerPython(), args, {env: pythonEnv({RAYON_RS_NUM_CPUS: '2'}), reject: false, stdin: 'ignore'})
  let done: TokenizeResult | undefined
  let failure: string | undefined
  for await (const line of createInterface({input: child.stdout!})) {
    const event = parseJsonLine(line)
    if (!event) continue
    if (event.event === 'progress') {
      options.onProgress?.({file: String(event.file), bytesDone: Number(event.bytes_done), bytesTotal: Number(event.bytes_total), tokens: Number(event.tokens)})
    } else if (event.event === 'done') {
      const {event: _, ...result} = event
      done = result as unknown as TokenizeResult
    } else if (event.event === 'error') {
      failure = String(event.message)
    }
  }
  const result = await child
  if (failure) throw new PsycheError(failure)
  if (result.exitCode !== 0 || !done) {
    const last = String(result.stderr ?? '')
      .trim()
      .split('\n')
      .pop()
    throw new PsycheError(`tokenizer process failed (exit ${result.exitCode ?? result.signal}): ${last || 'no output'}`)
  }
  return done
}
