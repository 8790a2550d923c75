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
const screen = () => tmux('capture-pane', '-p', '-t', session)

async function until(check: (text: string) => boolean, what: string, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs
  let text = ''
  while (Date.now() < deadline) {
    text = screen()
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

  it('server run on a terminal: phase, round and epoch with time left, clients and their health, witness quorum, loss with a sparkline, bytes, applied of accepted', async () => {
    const state = writeE2eRun(dir.path, {roundsPerEpoch: 20, totalSteps: 20, initMinClients: 2, maxRoundTrainTime: 20, lr: 1e-2})
    const port = await freePort()
    tmux('new-session', '-d', '-s', session, '-x', '150', '-y', '40', '-c', projectRoot, `${process.execPath} ${cliPath} server run --state ${state} --server-port ${port}; sleep 60`)
    await until((t) => t.includes('psyche server · run e2e') && t.includes('phase WaitingForMembers'), 'the view', 60_000)
    const clients = ['a', 'b'].map((name) => new JsonProcess(name, ['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'e2e', '--config', state, '--threads', '1', '--json']))
    procs.push(...clients)
    const first = await until((t) => /phase Round(Train|Witness)/.test(t) && /clients 2 healthy/.test(t), 'a round with both clients', 180_000)
    assert.match(first, /round \d+\/20 {3}epoch 0/)
    assert.match(first, /\d+s left/)
    // Two rounds reported: a loss, a sparkline of at least two bars, bytes and results applied of accepted.
    const later = await until((t) => /loss \d+\.\d{3} [▁▂▃▄▅▆▇█]{2,}/.test(t), 'two losses in the sparkline', 180_000)
    assert.match(later, /witnesses \d\/2 \(quorum 2\)/)
    assert.match(later, /applied [12] of 2 accepted/)
    assert.match(later, /in \d+\.\d\d MB {3}out \d+\.\d\d MB/)
    const rows = later.split('\n').filter((l) => /^\s*│?\s+[0-9a-f]{12}… +Healthy +step \d+ +loss \d/.test(l))
    assert.equal(rows.length, 2, `a row per client:\n${later}`)
    assert.doesNotMatch(later, /Warning|Error|Encountered/, 'nothing but the view on the screen')
    // Work happened: the clients applied rounds with each other's results, with equal parameters.
    for (const c of clients) await c.waitFor((e) => e.event === 'round' && e.applied === 2, 'a round with both results applied', 120_000)
    process.stdout.write(`# the terminal view, as captured:\n${later.split('\n').map((l) => `# ${l}`).join('\n')}\n`)
  })
})
