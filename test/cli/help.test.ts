import assert from 'node:assert/strict'
import {readdirSync, statSync} from 'node:fs'
import {join, relative} from 'node:path'
import {test} from 'node:test'
import {Config, run} from '@oclif/core'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli} from '../helpers.js'

/** Every command file under src/commands, as the ids a user types ("model init"). */
function commandIds(dir = join(projectRoot, 'src', 'commands')): string[] {
  const ids: string[] = []
  for (const name of readdirSync(dir)) {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) ids.push(...commandIds(path))
    else if (name.endsWith('.ts') && name !== 'index.ts')
      ids.push(
        relative(join(projectRoot, 'src', 'commands'), path)
          .replace(/\.ts$/, '')
          .split('/')
          .join(' '),
      )
  }
  return ids.sort()
}

/**
 * Runs the CLI in this process, as bin/psyche.js does (oclif's run, then its exit code: 0, or the error's
 * `oclif.exit`), with stdout and stderr captured. A fresh oclif Config each time: a topic's help leaves state behind
 * in the one it used. oclif sets process.exitCode on an error: it is put back. A few milliseconds a command instead of a second or two for a process.
 */
async function runInProcess(argv: string[]): Promise<{exitCode: number; stdout: string; stderr: string}> {
  const config = await Config.load({root: projectRoot})
  const stdout: string[] = []
  const stderr: string[] = []
  const write = {out: process.stdout.write, err: process.stderr.write}
  process.stdout.write = ((chunk: string | Uint8Array) => stdout.push(String(chunk)) > 0) as typeof process.stdout.write
  process.stderr.write = ((chunk: string | Uint8Array) => stderr.push(String(chunk)) > 0) as typeof process.stderr.write
  const exitCodeBefore = process.exitCode
  let exitCode = 0
  try {
    await run(argv, config)
  } catch (error) {
    const e = error as {message?: string; oclif?: {exit?: number}}
    exitCode = e.oclif?.exit ?? 1
    stderr.push(e.message ?? String(error))
  } finally {
    process.stdout.write = write.out
    process.stderr.write = write.err
    process.exitCode = exitCodeBefore // oclif sets it on a failed command, for the process it assumes it owns
  }
  return {exitCode, stdout: stdout.join(''), stderr: stderr.join('')}
}

const ids = commandIds()
const topics = [...new Set(ids.filter((id) => id.includes(' ')).map((id) => id.split(' ')[0]))]

test('the command files are found (the checks below cover them all)', () => {
  assert.ok(ids.includes('train') && ids.includes('model init'), `found commands: ${ids.join(', ')}`)
  assert.ok(topics.includes('model') && topics.includes('server'), `found topics: ${topics.join(', ')}`)
})

test('every command has --help with its usage and --json, and an unknown flag exits with code 2 naming it', async () => {
  for (const id of ids) {
    const help = await runInProcess([...id.split(' '), '--help'])
    assert.equal(help.exitCode, 0, `psyche ${id} --help: ${help.stderr}`)
    assert.match(help.stdout, new RegExp(`USAGE\\s+\\$ psyche ${id}\\b`), `psyche ${id} --help shows its usage`)
    assert.match(help.stdout, /--json/, `psyche ${id} has --json`)
    const bad = await runInProcess([...id.split(' '), '--no-such-flag'])
    assert.equal(bad.exitCode, 2, `psyche ${id} --no-such-flag exits 2: ${bad.stderr}`)
    assert.match(bad.stderr, /--no-such-flag/, `psyche ${id} --no-such-flag names the flag`)
  }
})

test('the root help lists every topic, and every topic has --help listing its commands', async () => {
  const root = await runInProcess(['--help'])
  assert.equal(root.exitCode, 0, root.stderr)
  for (const topic of topics) {
    assert.match(root.stdout, new RegExp(`\\b${topic}\\b`), `root help lists topic ${topic}`)
    const r = await runInProcess([topic, '--help'])
    assert.equal(r.exitCode, 0, `psyche ${topic} --help: ${r.stderr}`)
    for (const id of ids.filter((x) => x.startsWith(`${topic} `))) assert.ok(r.stdout.includes(id), `psyche ${topic} --help lists ${id}`)
  }
})

test('the real executable (bin/psyche.js, its own process): --help exits 0, an unknown flag exits 2', async () => {
  const [help, bad] = await Promise.all([runCli(['train', '--help']), runCli(['model', 'init', '--no-such-flag'])])
  assert.equal(help.exitCode, 0, help.stderr)
  assert.match(help.stdout, /USAGE\s+\$ psyche train\b/)
  assert.equal(bad.exitCode, 2, bad.stderr)
  assert.match(bad.stderr, /Nonexistent flag: --no-such-flag/)
})

test('join --keep-checkpoints: documented with its default; not an integer ≥ 1, or without --checkpoint-dir, exits 2 naming the flag', async () => {
  const help = await runInProcess(['join', '--help'])
  assert.match(help.stdout, /--keep-checkpoints=<value>\s+keep the last N epochs' checkpoints in --checkpoint-dir[^[]*\[default: 3\]/)
  for (const value of ['0', '-1', 'abc', '2.5']) {
    const bad = await runInProcess(['join', '--run-id', 'r', '--server-addr', '127.0.0.1:1', '--checkpoint-dir', '/nonexistent/psyche', `--keep-checkpoints=${value}`])
    assert.equal(bad.exitCode, 2, `--keep-checkpoints=${value}: ${bad.stderr}`)
    assert.match(bad.stderr, /--keep-checkpoints/, `--keep-checkpoints=${value} names the flag`)
    assert.match(bad.stderr, /Expected an integer/)
  }
  const alone = await runInProcess(['join', '--run-id', 'r', '--server-addr', '127.0.0.1:1', '--keep-checkpoints', '2'])
  assert.equal(alone.exitCode, 2, alone.stderr)
  assert.match(alone.stderr, /--keep-checkpoints[\s\S]*--checkpoint-dir/)
})
