import assert from 'node:assert/strict'
import {execFileSync, spawnSync} from 'node:child_process'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {freePort, JsonProcess, writeE2eRun} from '../e2e/helpers.js'
import {cliPath, tempDir} from '../helpers.js'

const hasTmux = spawnSync('tmux', ['-V'], {stdio: 'ignore'}).status === 0
const session = `psyche-view-${process.pid}`
const tmux = (...args: string[]) => execFileSync('tmux', args, {encoding: 'utf8'})
/** What a person sees in the tmux pane now. */
// A person's terminal: CI runs this test with CI=true, which (like ink) turns the live view into plain lines.
const asPerson = `env -u CI -u CONTINUOUS_INTEGRATION`
const screen = (window: string) => tmux('capture-pane', '-p', '-t', `${session}:${window}`)

async function until(check: (text: string) => boolean, what: string, timeoutMs: number, window = 'server'): Promise<string> {
  const deadline = Date.now() + timeoutMs
  let text = ''
  while (Date.now() < deadline) {
    text = screen(window)
    if (check(text)) return text
    await new Promise((r) => setTimeout(r, 500))
  }
  throw new Error(`terminal view: timed out waiting for ${what}; the screen shows:\n${text}`)
}

describe('live terminal view (ink) in a tmux pane', {timeout: 300_000, skip: hasTmux ? false : 'tmux is not installed'}, () => {
  const dir = tempDir('psyche-view-')
  const procs: JsonProcess[] = []
  before(async () => {
    await ensureDemoCorpus()
  })
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    spawnSync('tmux', ['kill-session', '-t', session], {stdio: 'ignore'})
    dir.cleanup()
  })

  it('server run and join on a terminal: phase, round and epoch with time left, clients and their health, witness quorum, loss with a sparkline, bytes, applied of accepted', async () => {
    const state = writeE2eRun(dir.path, {roundsPerEpoch: 20, totalSteps: 20, initMinClients: 2, maxRoundTrainTime: 20, lr: 1e-2})
    const port = await freePort()
    tmux(
      'new-session',
      '-d',
      '-s',
      session,
      '-n',
      'server',
      '-x',
      '150',
      '-y',
      '40',
      '-c',
      projectRoot,
      `${asPerson} ${process.execPath} ${cliPath} server run --state ${state} --server-port ${port}; sleep 60`,
    )
    await until((t) => t.includes('psyche server · run e2e') && t.includes('phase WaitingForMembers'), 'the view', 60_000)
    // One client on a terminal (its own live view), one with --json (its events tell the test what happened).
    tmux(
      'new-window',
      '-d',
      '-t',
      session,
      '-n',
      'join',
      '-c',
      projectRoot,
      `${asPerson} ${process.execPath} ${cliPath} join --server-addr 127.0.0.1:${port} --run-id e2e --config ${state} --threads 1; sleep 60`,
    )
    const clients = ['b'].map((name) => new JsonProcess(name, ['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'e2e', '--config', state, '--threads', '1', '--json']))
    procs.push(...clients)
    const first = await until((t) => /phase Round(Train|Witness)/.test(t) && /clients 2 healthy/.test(t), 'a round with both clients', 180_000)
    assert.match(first, /round \d+\/20 {3}epoch 0/)
    assert.match(first, /epoch ends in ~\d+s|\d+s left/)
    assert.match(first, /witnesses \d\/\d \(quorum \d\)/)
    // A round reported: its loss on the sparkline, bytes, and results applied of accepted.
    const later = await until((t) => /loss \d+\.\d{3} [▁▂▃▄▅▆▇█]+/.test(t), 'a loss on the sparkline', 180_000)
    assert.match(later, /applied \d of \d accepted/)
    assert.match(later, /in \d+\.\d\d MB {3}out \d+\.\d\d MB/)
    const rows = later.split('\n').filter((l) => /^\s*│?\s+[0-9a-f]{12}… +\w+ +step [\d–]+ +loss/.test(l))
    assert.equal(rows.length, 2, `a row per client:\n${later}`)
    assert.ok(
      rows.some((r) => /Healthy +step \d+ +loss \d/.test(r)),
      `a healthy client that reported:\n${later}`,
    )
    assert.doesNotMatch(later, /Warning:|Encountered/, 'nothing but the view on the screen')
    // Work happened: the --json client applied a round with results in it.
    await clients[0].waitFor((e) => e.event === 'round' && e.applied >= 1, 'a round with results applied', 120_000)
    const joined = await until((t) => /psyche join · run e2e · [0-9a-f]{12}…/.test(t) && /\(me\)/.test(t) && /phase \w+/.test(t), "the client's own view", 60_000, 'join')
    assert.match(joined, /round \d+\/20 {3}epoch \d/)
    assert.match(joined, /loss [\d.–]+/)
    assert.match(joined, /tokens\/s [\d–]+ {3}in /)
    assert.doesNotMatch(joined, /Warning:|Encountered/)
    process.stdout.write(
      `# the client's view, as captured:\n${joined
        .split('\n')
        .map((l) => `# ${l}`)
        .join('\n')}\n`,
    )
    process.stdout.write(
      `# the terminal view, as captured:\n${later
        .split('\n')
        .map((l) => `# ${l}`)
        .join('\n')}\n`,
    )
  })
})
