import assert from 'node:assert/strict'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {execa} from 'execa'
import {projectRoot} from '../../src/core/worker/python.js'

/**
 * The benchmarks must keep working between their real runs (`npm run bench`, whose numbers bench/README.md records):
 * each runs here once in a small mode (the same code, fewer repeats, rounds or seconds) and must exit 0 with its
 * table filled with measured numbers. Timings are not checked: this machine is shared, and that is the bench's job.
 */
async function bench(name: string, env: Record<string, string>): Promise<string> {
  const r = await execa(process.execPath, ['--import', 'tsx', join(projectRoot, 'bench', name)], {cwd: projectRoot, reject: false, env: {...env, NO_COLOR: '1'}})
  assert.equal(r.exitCode, 0, `bench/${name} failed:\n${r.stdout}\n${r.stderr}`)
  return r.stdout
}

/** The data rows of the markdown tables in a bench's output (not the header or the |---| line). */
const tableRows = (out: string) => out.split('\n').filter((l) => /^\|.*\|$/.test(l) && !/^\|[-| ]+\|$/.test(l) && /\|\s*[\d.]+\s*(\w+\/?\w*)?\s*\|/.test(l))

describe('benchmarks, small modes (test:all)', {timeout: 600_000}, () => {
  it('bench/data.bench.ts (1 s per provider): batches per second from the local, HTTP and TCP providers', async () => {
    const out = await bench('data.bench.ts', {BENCH_SECONDS: '1'})
    const rows = tableRows(out)
    for (const provider of ['Local', 'Http', 'Server (TCP)'])
      assert.ok(
        rows.some((r) => r.includes(`| ${provider} |`)),
        `a row for ${provider}:\n${out}`,
      )
  })

  it('bench/p2p.bench.ts (one repeat): blob fetches, concurrent fetches, announcement latency and the model transfer', async () => {
    const out = await bench('p2p.bench.ts', {BENCH_REPEATS: '1'})
    assert.ok(tableRows(out).length >= 3, `blob fetch rows:\n${out}`)
    assert.match(out, /8 × 1 MiB concurrently \(bound 4\): [\d.]+ ms/)
    assert.match(out, /announcement latency \(publish -> handler, median of 20\): [\d.]+ ms/)
    assert.match(out, /model transfer from .* MB in \d+ ms/)
  })
})
