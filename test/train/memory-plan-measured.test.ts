import assert from 'node:assert/strict'
import {execFileSync} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {memoryPlan} from '../../src/core/train/memory-plan.js'
import {projectRoot, workerPython} from '../../src/core/worker/python.js'

/**
 * `psyche plan`'s bytes per rank against a real sharded client's: bench/sharding_memory.py trains two rounds of
 * DisTrO and of SparseLoCo on tiny-demo with 2 gloo ranks (FSDP2, delay correction) and counts what each rank holds;
 * for SparseLoCo, at its last inner AdamW step, every tensor alive in the process too (the round's start copy is one).
 */
const config = JSON.parse(readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'model', 'config.json'), 'utf8')) as Record<string, unknown>
const near = (measured: number, planned: number, tolerance: number, what: string) =>
  assert.ok(Math.abs(measured - planned) <= tolerance * planned, `${what}: measured ${measured}, planned ${planned}`)

describe('psyche plan against a measured sharded client (tiny-demo, 2 gloo ranks)', () => {
  it('gives the parameter, gradient and optimizer-state bytes each rank holds, DisTrO and SparseLoCo', () => {
    const out = execFileSync(workerPython(), ['bench/sharding_memory.py', '--template', 'tiny-demo', '--ranks', '2', '--optimizer', 'distro,sparseloco', '--json'], {
      cwd: projectRoot,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    })
    const measured = JSON.parse(out.trim().split('\n').at(-1)!).ranks['2'] as Record<string, Record<string, number>[]>
    const distro = memoryPlan(config, {shards: 2, microBatch: 2, seqLen: 65, optimizer: 'distro', chunk: 64}).per_rank
    const sparse = memoryPlan(config, {shards: 2, microBatch: 1, seqLen: 65, optimizer: 'sparseloco', chunk: 64, topk: 32}).per_rank
    assert.equal(measured.distro.length, 2)
    assert.equal(measured.sparseloco.length, 2)
    for (const r of measured.distro) {
      near(r.parameters, distro.parameters, 0.01, `DisTrO rank ${r.rank} parameters`)
      near(r.gradients, distro.gradients, 0.01, `DisTrO rank ${r.rank} gradients`)
      near(r.distro_state, distro.optimizer_state, 0.01, `DisTrO rank ${r.rank} state`)
    }
    for (const r of measured.sparseloco) {
      near(r.parameters, sparse.parameters, 0.01, `SparseLoCo rank ${r.rank} parameters`)
      near(r.gradients, sparse.gradients, 0.01, `SparseLoCo rank ${r.rank} gradients`)
      for (const part of ['error_feedback', 'inner_adamw_moments', 'committed']) near(r[part], sparse.optimizer_state_parts[part], 0.01, `SparseLoCo rank ${r.rank} ${part}`)
      // everything alive at the inner steps' peak: parameters, gradients and the whole state, the start copy included
      near(r.live_tensors, sparse.parameters + sparse.gradients + sparse.optimizer_state, 0.02, `SparseLoCo rank ${r.rank} live tensors`)
    }
    // sharded: half of the unsharded client's bytes, and work happened (state was built)
    assert.equal(measured.sparseloco[0].parameters * 2, memoryPlan(config, {shards: 1, microBatch: 1, seqLen: 65}).parameters * 4)
    assert.ok(measured.sparseloco.every((r) => r.inner_adamw_moments > 0 && r.committed > 0))
  })
})
