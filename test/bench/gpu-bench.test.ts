import assert from 'node:assert/strict'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {execa} from 'execa'
import {projectRoot, pythonEnv, workerPython} from '../../src/core/worker/python.js'

/**
 * bench/gpu.bench.ts (`npm run bench -- gpu`) must keep working where no GPU is: its `--device cpu --tiny` mode runs
 * every part of it (plain loop vs psyche train, DisTrO on the device, a 2-client testnet) on the tiny-demo model,
 * and without CUDA the real mode skips with a clear line and exit 0.
 */
const bench = ['--import', 'tsx', join(projectRoot, 'bench', 'gpu.bench.ts')]
const cuda = (await execa(workerPython(), ['-c', 'import torch; print(torch.cuda.is_available())'], {env: pythonEnv()})).stdout.trim() === 'True'

describe('bench/gpu.bench.ts', () => {
  it('without CUDA: says it skipped and exits 0', {skip: cuda ? 'this machine has a CUDA GPU' : false}, async () => {
    const r = await execa(process.execPath, bench, {cwd: projectRoot, reject: false})
    assert.equal(r.exitCode, 0, r.stderr)
    assert.match(r.stdout, /no CUDA device: skipped/)
  })

  it('--device cpu --tiny runs the whole bench on CPU and reports every number', {timeout: 540_000}, async () => {
    const r = await execa(process.execPath, [...bench, '--device', 'cpu', '--tiny', '--json'], {
      cwd: projectRoot,
      reject: false,
      env: {BENCH_GPU_STEPS: '6', BENCH_GPU_ROUNDS: '2'},
    })
    assert.equal(r.exitCode, 0, `${r.stdout}\n${r.stderr}`)
    const report = JSON.parse(r.stdout.trim().split('\n').at(-1)!)
    assert.equal(report.device, 'cpu')
    assert.equal(report.train.length, 1)
    const train = report.train[0]
    assert.ok(train.best.plain > 0 && train.best.psyche > 0, 'both loops measured tokens/s')
    assert.ok(train.ratio > 0.2 && train.ratio < 5, `ratio ${train.ratio}`)
    assert.ok(Number.isFinite(train.loss.first) && train.loss.last < train.loss.first, 'psyche train learned')
    const distro = report.distro[0]
    assert.equal(distro.precision, 'fp32')
    assert.ok(distro.result_bytes > 100, 'a real DisTrO result')
    assert.ok(distro.compress_gb_per_s > 0 && distro.decode_gb_per_s > 0 && distro.decompress_apply_gb_per_s > 0)
    assert.ok(distro.distro_share_1_peer > 0 && distro.distro_share_1_peer < 1)
    const testnet = report.testnet
    assert.equal(testnet.ended, 'rounds')
    assert.ok(testnet.rounds >= 2, `testnet rounds ${testnet.rounds}`)
    assert.equal(testnet.hashes_equal, true)
    assert.equal(testnet.rounds_without_exchange, 0)
    assert.ok(testnet.results_applied > 0, 'the two clients applied each other’s results')
  })
})
