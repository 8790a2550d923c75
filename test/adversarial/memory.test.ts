/**
 * Issue 20's memory findings, as an attacker would try them, against servers in their own processes
 * (bench/attack-target.ts), the attackers in another (bench/attack-hostile.ts): the server's resident memory stays
 * bounded and an honest client is still served. Before the fixes: 70 hostile hellos took the coordinator from 230 MB
 * to 2.45 GB, and one data client that never read took the data server from 240 MB to 2.23 GB.
 */
import assert from 'node:assert/strict'
import {spawn, type ChildProcess} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {after, describe, test} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {TcpDataProvider} from '../../src/core/data/index.js'
import {generateIdentity} from '../../src/core/protocol/index.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {scaleRun} from '../scale/harness.js'

const children: ChildProcess[] = []
after(() => {
  for (const c of children) if (c.exitCode === null) c.kill('SIGKILL')
})

function rssMb(pid: number): number {
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024
}

function start(args: string[], env: Record<string, string> = {}): {child: ChildProcess; next: () => Promise<Record<string, unknown>>} {
  const child = spawn(process.execPath, ['--import', 'tsx', ...args], {cwd: projectRoot, env: {...process.env, ...env}, stdio: ['pipe', 'pipe', 'inherit']})
  children.push(child)
  const lines = createInterface({input: child.stdout!})[Symbol.asyncIterator]()
  return {
    child,
    next: async () => {
      const {value, done} = await lines.next()
      if (done) throw new Error(`${args.join(' ')} ended`)
      return JSON.parse(value)
    },
  }
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return
  const exited = new Promise((r) => child.once('exit', r))
  child.stdin!.end()
  setTimeout(() => child.kill('SIGKILL'), 5000).unref()
  await exited
}

/** The peak resident memory of `pid` over `ms`. */
async function peakRss(pid: number, ms: number): Promise<number> {
  let peak = rssMb(pid)
  const end = Date.now() + ms
  while (Date.now() < end) {
    await new Promise((r) => setTimeout(r, 100))
    peak = Math.max(peak, rssMb(pid))
  }
  return peak
}

describe('resident memory under hostile connections', {timeout: 120_000}, () => {
  test('coordinator: 300 free identities say hello with the largest address list and never read; RSS grows < 100 MB and an honest client joins', async () => {
    const run = await scaleRun({clients: 2, rounds: 5})
    run.run_id = 'memory-test'
    const target = start(['bench/attack-target.ts', 'coordinator'], {PSYCHE_ATTACK_RUN: JSON.stringify(run)})
    const {port} = (await target.next()) as {port: number}
    await new Promise((r) => setTimeout(r, 500))
    const before = rssMb(target.child.pid!)
    const attacker = start(['bench/attack-hostile.ts', 'coordinator', `127.0.0.1:${port}`, run.run_id!, '300'])
    const stats = (await attacker.next()) as {opened: number}
    assert.ok(stats.opened >= 250, `the attacker opened ${stats.opened} connections`)
    const peak = await peakRss(target.child.pid!, 4000)
    const identity = generateIdentity()
    const honest = await CoordinatorConnection.connect({addr: `127.0.0.1:${port}`, runId: run.run_id!, identity, p2pAddrs: ['/ip4/127.0.0.1/tcp/4001'], join: true})
    try {
      assert.ok(honest.state?.pending.includes(identity.id), 'the honest client joined')
      assert.ok(honest.peers[identity.id], 'and is in the directory it was sent')
    } finally {
      await honest.close()
    }
    await stop(attacker.child)
    await stop(target.child)
    assert.ok(peak - before < 100, `the coordinator grew from ${before.toFixed(0)} MB to ${peak.toFixed(0)} MB`)
  })

  test('data server: 30 clients ask for 60 batches each (about 470 MB of answers) and never read; RSS grows < 100 MB and an honest client is served', async () => {
    const seq = 1024
    const dir = mkdtempSync(join(tmpdir(), 'psyche-memory-data-'))
    try {
      const ids = new Uint16Array(1_000_000)
      for (let i = 0; i < ids.length; i++) ids[i] = (i * 7919) % 50_000
      writeFileSync(join(dir, 'a.bin'), Buffer.from(ids.buffer))
      const target = start(['bench/attack-target.ts', 'data'], {PSYCHE_ATTACK_DATA_DIR: dir, PSYCHE_ATTACK_SEQ: String(seq)})
      const {port} = (await target.next()) as {port: number}
      await new Promise((r) => setTimeout(r, 500))
      const before = rssMb(target.child.pid!)
      const attacker = start(['bench/attack-hostile.ts', 'data', `127.0.0.1:${port}`, String(seq), '30'])
      await attacker.next()
      const peak = await peakRss(target.child.pid!, 4000)
      const honest = await TcpDataProvider.connect(`127.0.0.1:${port}`, {seqLen: seq, timeoutMs: 10_000})
      try {
        assert.equal((await honest.getSamples([5, 6])).length, 2 * (seq + 1))
      } finally {
        await honest.close()
      }
      await stop(attacker.child)
      await stop(target.child)
      assert.ok(peak - before < 100, `the data server grew from ${before.toFixed(0)} MB to ${peak.toFixed(0)} MB`)
    } finally {
      rmSync(dir, {recursive: true, force: true})
    }
  })
})
