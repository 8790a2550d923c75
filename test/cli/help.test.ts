import assert from 'node:assert/strict'
import {readdirSync, statSync} from 'node:fs'
import {join, relative} from 'node:path'
import {test} from 'node:test'
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

test('every command and topic has --help, and bad usage exits with code 2', async () => {
  const ids = commandIds()
  assert.ok(ids.includes('train') && ids.includes('model init'), `found commands: ${ids.join(', ')}`)
  const topics = [...new Set(ids.filter((id) => id.includes(' ')).map((id) => id.split(' ')[0]))]
  const root = await runCli(['--help'])
  assert.equal(root.exitCode, 0)
  for (const topic of topics) assert.match(root.stdout, new RegExp(`\\b${topic}\\b`), `root help lists topic ${topic}`)
  // Two CLI processes at a time (each one is mostly Node start-up and module loading): half the wall time on 2 cores.
  const queue = [...ids]
  const check = async () => {
    for (let id = queue.shift(); id !== undefined; id = queue.shift()) {
      const r = await runCli([...id.split(' '), '--help'])
      assert.equal(r.exitCode, 0, `psyche ${id} --help: ${r.stderr}`)
      assert.match(r.stdout, /USAGE/, `psyche ${id} --help shows usage`)
      assert.match(r.stdout, /--json/, `psyche ${id} has --json`)
      const bad = await runCli([...id.split(' '), '--no-such-flag'])
      assert.equal(bad.exitCode, 2, `psyche ${id} --no-such-flag exits 2`)
    }
  }
  await Promise.all([check(), check()])
  for (const topic of topics) {
    const r = await runCli([topic, '--help'])
    assert.equal(r.exitCode, 0, `psyche ${topic} --help`)
  }
})
