import assert from 'node:assert/strict'
import {execFileSync, spawnSync} from 'node:child_process'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {writeE2eRun} from '../e2e/helpers.js'
import {cliPath, tempDir} from '../helpers.js'

const hasTmux = spawnSync('tmux', ['-V'], {stdio: 'ignore'}).status === 0
const session = `psyche-testnet-view-${process.pid}`
const tmux = (...args: string[]) => execFileSync('tmux', args, {encoding: 'utf8'})
// A person's terminal: CI runs this test with CI=true, which (like ink) turns the live view into plain lines.
const asPerson = `env -u CI -u CONTINUOUS_INTEGRATION`
let lastScreen = ''
/** What a person sees in the tmux pane now. */
const screen = () => {
  try {
    lastScreen = tmux('capture-pane', '-p', '-t', `${session}:testnet`)
  } catch (error) {
    throw new Error(`the tmux pane is gone (${(error as Error).message.trim()}); it last showed:\n${lastScreen}`)
  }
  return lastScreen
}

async function until(check: (text: string) => boolean, what: string, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs
  let text = ''
  while (Date.now() < deadline) {
    text = screen()
    if (check(text)) return text
    await new Promise((r) => setTimeout(r, 250))
  }
  throw new Error(`testnet view: timed out waiting for ${what}; the screen shows:\n${text}`)
}

const roundOf = (text: string) => Number(/round (\d+)\/\d+/.exec(text)?.[1] ?? NaN)
const clientRows = (text: string) => text.split('\n').filter((l) => /^\s*│?\s+client-\d +\w+ +step [\d–]+ +loss/.test(l))

describe('psyche testnet on a terminal: the live view in a tmux pane', {timeout: 300_000, skip: hasTmux ? false : 'tmux is not installed'}, () => {
  const dir = tempDir('psyche-testnet-view-')
  before(async () => {
    await ensureDemoCorpus()
  })
  after(() => {
    spawnSync('tmux', ['kill-session', '-t', session], {stdio: 'ignore'})
    dir.cleanup()
  })

  it('shows the phase and round advancing, both clients with their steps and losses, the loss sparkline; then the summary says the clients exchanged', async () => {
    const state = writeE2eRun(dir.path, {roundsPerEpoch: 60, totalSteps: 60, initMinClients: 2, maxRoundTrainTime: 20, lr: 1e-2, batchSize: 48})
    tmux(
      'new-session',
      '-d',
      '-s',
      session,
      '-n',
      'testnet',
      '-x',
      '150',
      '-y',
      '40',
      '-c',
      projectRoot,
      `${asPerson} ${process.execPath} ${cliPath} testnet --clients 2 --config ${state} --rounds 40 --threads 1 --timeout 240; sleep 600`,
    )
    const first = await until((t) => /psyche testnet · 2 clients · coordinator 127\.0\.0\.1:\d+/.test(t) && /phase Round(Train|Witness)/.test(t), 'a round phase', 180_000)
    assert.match(first, /round \d+\/60 {3}epoch 0/)
    assert.match(first, /clients 2 healthy/)
    const r0 = roundOf(first)
    // Rounds advance, the clients report their steps and losses, and the coordinator's history gives the sparkline.
    // The screen waited for is one of the run in progress (both clients `training`): the run goes on for 40 rounds (each a few tenths of a second here; the watcher gets a state each second),
    // long after the round advanced past r0, so a capture never sees it ended unless the view stopped updating.
    const training = /training +step \d+ +loss \d+\.\d{3} +hash [0-9a-f]{8}/
    const later = await until(
      (t) => roundOf(t) > r0 && /loss \d+\.\d{3} [▁▂▃▄▅▆▇█]+/.test(t) && clientRows(t).filter((l) => training.test(l)).length === 2,
      'the round to advance, with both clients training and reporting',
      180_000,
    )
    const rows = clientRows(later)
    assert.deepEqual(
      rows.map((l) => /client-\d/.exec(l)![0]),
      ['client-0', 'client-1'],
    )
    for (const row of rows) assert.match(row, training)
    assert.doesNotMatch(later, /Warning:|Encountered/, 'nothing but the view on the screen')
    process.stdout.write(
      `# the testnet view, as captured:\n${later
        .split('\n')
        .map((l) => `# ${l}`)
        .join('\n')}\n`,
    )
    // Work happened: the testnet ends after 40 rounds and says the replicas agreed and exchanged results.
    const end = await until((t) => /testnet rounds after/.test(t) || /every round applied/.test(t) || /WARNING/.test(t), 'the summary', 180_000)
    assert.match(end, /every round applied every client's peers' results/)
    const equal = /parameter hashes equal in (\d+)\/(\d+) rounds/.exec(end)
    assert.ok(equal && Number(equal[2]) >= 40 && equal[1] === equal[2], `hashes equal in every round:\n${end}`)
    assert.match(end, /mean loss (\d+\.\d+) → (\d+\.\d+)/)
  })
})
