import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {test} from 'node:test'
import {liveTerminal} from '../../src/core/cli/terminal.js'
import {projectRoot} from '../../src/core/worker/python.js'

const tty = (columns: number | undefined) => ({isTTY: true, columns})

test('a live display needs two terminals with a width, and no CI', () => {
  assert.equal(liveTerminal({}, tty(80), tty(80)), true)
  assert.equal(liveTerminal({}, tty(0), tty(0)), false, 'a terminal of 0 columns')
  assert.equal(liveTerminal({}, tty(80), tty(undefined)), false, 'stderr without a width')
  assert.equal(liveTerminal({}, {isTTY: false}, tty(80)), false, 'stdout redirected to a file or pipe')
  assert.equal(liveTerminal({}, tty(80), {isTTY: false}), false, 'stderr redirected')
  assert.equal(liveTerminal({CI: 'true'}, tty(80), tty(80)), false, 'CI')
})

// In a real pseudo-terminal (util-linux `script`), sized with stty: the progress of long commands draws ora's
// spinner at 80 columns, and plain lines at 0 columns, where the spinner would redraw forever.
const hasScript = spawnSync('script', ['--version'], {stdio: 'ignore'}).status === 0
test('progress is plain lines on a terminal of 0 columns', {skip: hasScript ? false : 'util-linux script is not installed'}, () => {
  const probe = `import {Progress} from './src/core/cli/progress.ts'; const p = Progress.for({json: false}); p.status('working'); p.done('finished')`
  const inPty = (columns: number) => {
    const command = `stty cols ${columns} rows 24; exec node --import tsx --input-type=module -e "${probe}"`
    const env: NodeJS.ProcessEnv = {...process.env}
    delete env.CI
    const r = spawnSync('script', ['-qec', command, '/dev/null'], {cwd: projectRoot, encoding: 'utf8', timeout: 60_000, env})
    assert.equal(r.status, 0, `${r.stdout}${r.stderr}`)
    return r.stdout
  }
  const narrow = inPty(0)
  assert.match(narrow, /working\r?\n/)
  assert.match(narrow, /finished\r?\n/)
  assert.doesNotMatch(narrow, /\x1b\[\?25l/, 'no spinner (it hides the cursor first)')
  assert.ok(narrow.length < 200, `a few plain lines, not a redrawn spinner: ${JSON.stringify(narrow)}`)
  const wide = inPty(80)
  assert.match(wide, /\x1b\[\?25l/, 'the spinner at 80 columns')
  assert.match(wide, /finished/)
})
