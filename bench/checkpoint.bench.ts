// Checkpoint jobs against the local Hub server (`psyche hub serve` in its own process, on 127.0.0.1): upload
// and download throughput and each job's peak resident memory for the llama2-20m model (fp32 weights, its
// tokenizer and card), once as one model.safetensors (multipart LFS, 16 MiB parts) and once sharded at 25 MB.
// Every run uses a fresh repository and a fresh cache, so nothing is skipped as already present.
import {execa} from 'execa'
import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {createModelFromTemplate} from '../src/core/model.js'

const REPEATS = Number(process.env.BENCH_REPEATS ?? 3)
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const tmp = mkdtempSync(join(tmpdir(), 'psyche-bench-ckpt-'))
const model = join(tmp, 'model')
await createModelFromTemplate({template: 'llama2-20m', out: model, seed: 0})
const server = execa(process.execPath, ['bin/psyche.js', 'hub', 'serve', '--dir', join(tmp, 'hub'), '--json'], {reject: false})
try {
  const url: string = JSON.parse(await new Promise<string>((resolve) => createInterface({input: server.stdout!}).once('line', resolve))).listening.url
  const job = async (args: string[]) =>
    JSON.parse(
      String((await execa(process.execPath, ['--import', 'tsx', 'bench/checkpoint-job.ts', ...args])).stdout)
        .trim()
        .split('\n')
        .pop()!,
    )
  const rows: string[] = []
  let n = 0
  for (const [label, shard] of [
    ['one file', undefined],
    ['sharded 25 MB', '25000000'],
  ] as const) {
    const up: {seconds: number; bytes: number; peak_rss_bytes: number; files: number}[] = []
    const down: typeof up = []
    for (let i = 0; i < REPEATS; i++) {
      const repo = `bench/m${++n}`
      up.push(await job(['upload', model, repo, url, ...(shard ? [shard] : [])]))
      down.push(await job(['download', repo, url, join(tmp, `out${n}`), join(tmp, `cache${n}`)]))
      rmSync(join(tmp, `out${n}`), {recursive: true})
      rmSync(join(tmp, `cache${n}`), {recursive: true})
    }
    const mbps = (xs: typeof up) => `${(xs[0]!.bytes / 1e6 / median(xs.map((x) => x.seconds))).toFixed(0)} MB/s`
    const rss = (xs: typeof up) => `${(median(xs.map((x) => x.peak_rss_bytes)) / 2 ** 20).toFixed(0)} MiB`
    rows.push(
      `| ${label} (${up[0]!.files} files, ${(up[0]!.bytes / 1e6).toFixed(1)} MB) | ${median(up.map((x) => x.seconds)).toFixed(2)} s (${mbps(up)}) | ${rss(up)} | ${median(down.map((x) => x.seconds)).toFixed(2)} s (${mbps(down)}) | ${rss(down)} |`,
    )
  }
  console.log(`| llama2-20m | upload (median of ${REPEATS}) | upload peak RSS | download | download peak RSS |\n|---|---|---|---|---|\n${rows.join('\n')}`)
} finally {
  server.kill('SIGINT')
  await server
  rmSync(tmp, {recursive: true, force: true})
}
