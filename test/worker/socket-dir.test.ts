import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {chmodSync, existsSync, mkdirSync, readdirSync, statSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {WorkerClient} from '../../src/core/worker/client.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {cleanStaleSocketDirs, createSocketDir, workerSocketDir} from '../../src/core/worker/socket-dir.js'
import {tempDir} from '../helpers.js'

/** A pid that is certainly not running: a process that has exited. */
function deadPid(): number {
  const r = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))'], {encoding: 'utf8'})
  return Number(r.stdout)
}

describe('worker sockets live in a private directory of the process', () => {
  const tmp = tempDir('psyche-sockdir-')
  after(() => tmp.cleanup())

  it('makes a 0700 directory owned by this user, even under umask 000', () => {
    const old = process.umask(0)
    try {
      const dir = createSocketDir(tmp.path)
      const s = statSync(dir)
      assert.equal(s.mode & 0o777, 0o700)
      assert.equal(s.uid, process.getuid!())
      assert.match(dir, new RegExp(`psyche-workers-${process.pid}-`))
    } finally {
      process.umask(old)
    }
  })

  it('cleans what dead processes left (their directories and old loose sockets), and nothing else', () => {
    const base = join(tmp.path, 'base')
    mkdirSync(base)
    const dead = deadPid()
    mkdirSync(join(base, `psyche-workers-${dead}-abc123`))
    writeFileSync(join(base, `psyche-workers-${dead}-abc123`, 'w-00000000.sock'), '')
    writeFileSync(join(base, `psyche-worker-${dead}-0badf00d.sock`), '')
    mkdirSync(join(base, `psyche-workers-${process.pid}-xyz789`)) // alive: this process
    mkdirSync(join(base, `psyche-workers-1-live01`)) // alive: pid 1
    writeFileSync(join(base, 'psyche-worker-notes.txt'), '') // not ours by name
    const removed = cleanStaleSocketDirs(base)
    assert.deepEqual(removed.sort(), [`psyche-worker-${dead}-0badf00d.sock`, `psyche-workers-${dead}-abc123`].sort())
    assert.deepEqual(readdirSync(base).sort(), ['psyche-worker-notes.txt', `psyche-workers-${process.pid}-xyz789`, 'psyche-workers-1-live01'].sort())
  })

  it('a process removes its directory when it exits, and the next one cleans a killed one', () => {
    const runtime = join(tmp.path, 'runtime')
    mkdirSync(runtime)
    chmodSync(runtime, 0o700)
    const script = `import {workerSocketDir} from ${JSON.stringify(join(projectRoot, 'src/core/worker/socket-dir.ts'))}; const d = workerSocketDir(); console.log(d); if (process.argv[1] === 'kill') process.kill(process.pid, 'SIGKILL')`
    const run = (how: string) =>
      spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, how], {
        cwd: projectRoot,
        encoding: 'utf8',
        env: {...process.env, XDG_RUNTIME_DIR: runtime},
      })
    const clean = run('exit')
    const dir = clean.stdout.trim()
    assert.equal(clean.status, 0, clean.stderr)
    assert.ok(dir.startsWith(`${runtime}/psyche-workers-`), dir)
    assert.equal(existsSync(dir), false, 'removed at exit')
    const killed = run('kill')
    const left = killed.stdout.trim()
    assert.equal(existsSync(left), true, 'SIGKILL leaves it behind')
    const next = run('exit')
    assert.equal(next.status, 0, next.stderr)
    assert.equal(existsSync(left), false, 'the next start cleaned it')
    assert.deepEqual(readdirSync(runtime), [])
  })

  it('a real worker listens on an owner-only socket inside that directory, removed when it stops', async () => {
    const w = await WorkerClient.start({threads: 1})
    try {
      assert.equal(join(w.endpoint, '..'), workerSocketDir())
      assert.equal(statSync(workerSocketDir()).mode & 0o777, 0o700)
      assert.equal(statSync(w.endpoint).mode & 0o077, 0, 'the socket file is the owner’s only')
      assert.equal((await w.call<{ok: boolean}>('hello')).reply.ok, true)
    } finally {
      await w.shutdown()
    }
    assert.equal(existsSync(w.endpoint), false)
  })
})
