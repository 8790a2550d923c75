import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {test} from 'node:test'
import {Config, Flags, Parser} from '@oclif/core'
import {projectRoot} from '../../src/core/worker/python.js'
import {tempDir} from '../helpers.js'

// The README's shell blocks cannot drift from the CLI: each ```sh block is marked, on the line before it,
// `<!-- sh: run -->` (it runs on one machine, quickly: this test runs it, in a fresh directory, and it must succeed)
// or `<!-- sh: check -->` (it needs other machines, a cluster, a Hub or a long time: each `psyche` line's command
// must exist and its flags must parse, and each `npm run` script must exist).

interface Block {
  kind: string
  line: number
  text: string
}

function shellBlocks(): Block[] {
  const lines = readFileSync(join(projectRoot, 'README.md'), 'utf8').split('\n')
  const blocks: Block[] = []
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].trim() !== '```sh') continue
    let before = i - 1
    while (before > 0 && lines[before].trim() === '') before-- // prettier may leave a blank line after the marker
    const marker = /^<!-- sh: (\w+) -->$/.exec(lines[before]?.trim() ?? '')
    const end = lines.indexOf('```', i + 1)
    blocks.push({kind: marker?.[1] ?? 'unmarked', line: i + 1, text: lines.slice(i + 1, end).join('\n')})
    i = end
  }
  return blocks
}

/** A shell line's words: comments dropped, $(…) and $VARS as placeholders, "quoted strings" kept whole. */
function words(line: string): string[] {
  const code = line.replace(/\$\([^)]*\)/g, 'X').replace(/\$\w+/g, 'X')
  const out: string[] = []
  for (const m of code.matchAll(/"([^"]*)"|(\S+)/g)) {
    if (m[2]?.startsWith('#')) break
    out.push(m[1] ?? m[2])
  }
  while (out.length > 0 && /^[A-Z_]+=/.test(out[0])) out.shift() // VAR=value psyche …
  return out
}

const blocks = shellBlocks()

test('every shell block of the README is marked runnable here or checked by its flags', () => {
  assert.ok(blocks.length >= 8, `found ${blocks.length} blocks`)
  for (const b of blocks) assert.ok(['run', 'check'].includes(b.kind), `README.md:${b.line}: a \`\`\`sh block without <!-- sh: run --> or <!-- sh: check --> before it`)
  assert.ok(blocks.some((b) => b.kind === 'run'))
})

test('every psyche command in the README exists and its flags parse; every npm script it names exists', async () => {
  const config = await Config.load({root: projectRoot})
  const scripts = JSON.parse(readFileSync(join(projectRoot, 'package.json'), 'utf8')).scripts as Record<string, string>
  let checked = 0
  for (const b of blocks) {
    for (const line of b.text.split('\n')) {
      const w = words(line)
      if (w[0] === 'npm') {
        const script = w[1] === 'run' ? w[2] : w[1]
        assert.ok(scripts[script] !== undefined, `README.md block at line ${b.line}: npm ${w.slice(1).join(' ')}: no such script`)
        continue
      }
      if (w[0] !== 'psyche') continue
      // The longest prefix of words that is a command ("server run", then "server").
      let n = w.length
      while (n > 1 && !config.findCommand(w.slice(1, n).join(':'))) n--
      const id = w.slice(1, n).join(':')
      const found = config.findCommand(id)
      assert.ok(found, `README.md block at line ${b.line}: ${line.trim()}: no such command`)
      const C = await found.load()
      try {
        await Parser.parse(w.slice(n), {flags: {...C.baseFlags, ...C.flags, json: Flags.boolean()}, args: C.args ?? {}, strict: C.strict ?? true})
      } catch (error) {
        assert.fail(`README.md block at line ${b.line}: ${line.trim()}: ${(error as Error).message}`)
      }
      checked++
    }
  }
  assert.ok(checked >= 20, `checked ${checked} psyche lines`)
})

test('the runnable blocks run', {timeout: 300_000}, () => {
  for (const b of blocks.filter((x) => x.kind === 'run')) {
    const dir = tempDir('psyche-readme-')
    try {
      const script = `set -euo pipefail\npsyche() { node ${JSON.stringify(join(projectRoot, 'bin', 'psyche.js'))} "$@"; }\n${b.text}\n`
      const r = spawnSync('bash', ['-c', script], {cwd: dir.path, encoding: 'utf8', env: {...process.env, NO_COLOR: '1', CI: '1'}, timeout: 240_000})
      assert.equal(r.status, 0, `README.md block at line ${b.line} failed (exit ${r.status}):\n${b.text}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`)
    } finally {
      dir.cleanup()
    }
  }
})
