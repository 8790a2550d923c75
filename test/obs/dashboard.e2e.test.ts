import assert from 'node:assert/strict'
import {existsSync, mkdirSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {chromium, type Browser, type Page} from 'playwright-core'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {freePort, JsonProcess, writeE2eRun} from '../e2e/helpers.js'
import {tempDir} from '../helpers.js'
import {scrape} from './helpers.js'

export const CHROMIUM = '/usr/bin/chromium'
export const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run']
/** Screenshots taken by tests: under .cache/ (gitignored), never committed. */
const SCREENSHOT_DIR = join(projectRoot, '.cache', 'test-screenshots')

// Evaluated in the page as text: tsx's name helpers (__name) do not exist there.
const SEEN = `(() => {
  const canvas = document.querySelector('#plot-loss canvas')
  let blue = 0
  let red = 0
  if (canvas) {
    const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data
    // The train-loss series is drawn in #2563eb, the validation loss in #dc2626.
    const near = (i, r, g, b) => Math.abs(px[i] - r) < 40 && Math.abs(px[i + 1] - g) < 40 && Math.abs(px[i + 2] - b) < 40 && px[i + 3] > 0
    for (let i = 0; i < px.length; i += 4) {
      if (near(i, 0x25, 0x63, 0xeb)) blue++
      if (near(i, 0xdc, 0x26, 0x26)) red++
    }
  }
  const points = (id) => Number(document.getElementById('plot-' + id).dataset.points || 0)
  return {
    round: document.getElementById('round').textContent,
    phase: document.getElementById('phase').textContent,
    loss: points('loss'),
    validation: Number((document.getElementById('plot-loss').dataset.seriesPoints || '0,0').split(',')[1]),
    throughput: points('throughput'),
    time: points('time'),
    participation: points('participation'),
    bytes: points('bytes'),
    bluePixels: blue,
    redPixels: red,
    rows: [...document.querySelectorAll('#clients tr')].map((tr) => ({id: tr.getAttribute('title'), cells: [...tr.querySelectorAll('td')].map((td) => td.textContent)})),
  }
})()`

interface Seen {
  round: string
  phase: string
  loss: number
  /** Validation-loss points on the loss plot. */
  validation: number
  throughput: number
  time: number
  participation: number
  bytes: number
  bluePixels: number
  redPixels: number
  rows: {id: string | null; cells: (string | null)[]}[]
}

/** What the page shows: the header's round, the plotted values per plot, the coloured pixels of the loss plot, the client table. */
async function seen(page: Page): Promise<Seen> {
  return (await page.evaluate(SEEN)) as Seen
}

async function until<T>(page: Page, check: (s: Seen) => T | false, what: string, timeoutMs: number): Promise<T> {
  const deadline = Date.now() + timeoutMs
  let last: Seen | undefined
  while (Date.now() < deadline) {
    last = await seen(page)
    const ok = check(last)
    if (ok) return ok
    await new Promise((r) => setTimeout(r, 500))
  }
  throw new Error(`dashboard: timed out waiting for ${what}; it shows ${JSON.stringify(last)}`)
}

describe(
  'dashboard and metrics of a live run, in headless Chromium',
  {timeout: 420_000, skip: existsSync(CHROMIUM) ? false : `${CHROMIUM} is not installed (scripts/setup.mjs installs it with apt)`},
  () => {
    const dir = tempDir('psyche-dashboard-')
    const procs: JsonProcess[] = []
    let browser: Browser | undefined
    before(async () => {
      await ensureDemoCorpus()
    })
    after(async () => {
      await browser?.close()
      await Promise.all(procs.map((p) => p.stop()))
      dir.cleanup()
    })

    it('plots the rounds, advances the round, lists the clients; metrics scrape from the server and both clients; the history survives a reload and a server restart', async () => {
      // 12 rounds: the checks below that need the run in progress (the round advancing after the first loss point, both
      // clients connected at the scrape) come well before its end even when the browser starts late on a loaded machine;
      // with 6 the first point could already be the last round's.
      const state = writeE2eRun(dir.path, {roundsPerEpoch: 4, totalSteps: 12, initMinClients: 2, minClients: 1, maxRoundTrainTime: 20, lr: 1e-2})
      const saveDir = join(dir.path, 'server')
      const port = await freePort()
      const serverArgs = ['server', 'run', '--state', state, '--server-port', String(port), '--save-state-dir', saveDir, '--dashboard-port', '0', '--metrics-port', '0', '--json']
      const server = new JsonProcess('server', serverArgs)
      procs.push(server)
      const dash = (await server.waitFor((e) => e.event === 'dashboard_listening', 'the dashboard', 60_000)) as {url: string}
      const serverMetrics = (await server.waitFor((e) => e.event === 'metrics_listening', 'the metrics endpoint', 10_000)) as {port: number}
      const clients = ['a', 'b'].map(
        (name) =>
          new JsonProcess(name, [
            'join',
            '--server-addr',
            `127.0.0.1:${port}`,
            '--run-id',
            'e2e',
            '--config',
            state,
            '--threads',
            '1',
            '--metrics-port',
            '0',
            '--eval-every',
            '2',
            '--json',
          ]),
      )
      procs.push(...clients)
      const ids = await Promise.all(clients.map(async (c) => (await c.waitFor((e) => e.event === 'started', 'the client to start', 120_000)).client_id as string))
      const clientMetricPorts = await Promise.all(clients.map(async (c) => (await c.waitFor((e) => e.event === 'metrics_listening', 'metrics', 10_000)).port as number))

      browser = await chromium.launch({executablePath: CHROMIUM, args: CHROMIUM_ARGS})
      const page = await browser.newPage({viewport: {width: 1280, height: 1000}})
      await page.goto(dash.url)
      // The client table lists both clients once the epoch starts.
      await until(
        page,
        (s) => s.rows.length === 2 && ids.every((id) => s.rows.some((r) => r.id === id)) && s.rows.every((r) => r.cells[1] === 'Healthy'),
        'both clients as Healthy rows',
        180_000,
      )
      // Rounds advance in the header, and the loss plot gets points (drawn: the series' colour is on the canvas).
      const first = await until(page, (s) => s.loss >= 1 && s.bluePixels > 20 && s, 'a loss point', 240_000)
      const firstRound = Number(first.round.split(' / ')[0])
      const later = await until(page, (s) => Number(s.round.split(' / ')[0]) > firstRound && s.loss > first.loss && s, 'the round to advance', 180_000)
      assert.ok(later.time >= 1 && later.participation >= 1 && later.bytes >= 1 && later.throughput >= 1, `every plot has points: ${JSON.stringify(later)}`)
      for (const row of later.rows) assert.notEqual(row.cells[4], '–', `client ${row.id} reported a loss`)
      // Validation: the clients evaluate the held-out split after every 2nd round; its points are on the loss plot, drawn.
      const validated = await until(page, (s) => s.validation >= 1 && s.redPixels > 10 && s, 'a validation-loss point', 180_000)
      assert.ok(validated.loss > validated.validation, 'train-loss points too')
      mkdirSync(SCREENSHOT_DIR, {recursive: true})
      await page.screenshot({path: join(SCREENSHOT_DIR, 'dashboard.png')})

      // Work happened: both clients applied both results in the same rounds, with equal parameters.
      for (const c of clients) await c.waitFor((e) => e.event === 'round' && e.step >= 2, 'two applied rounds', 120_000)
      const rounds = clients.map((c) => c.rounds())
      const common = rounds[0].filter((r) => rounds[1].some((q) => q.step === r.step))
      assert.ok(common.length >= 2)
      for (const r of common) assert.equal(r.param_hash, rounds[1].find((q) => q.step === r.step)!.param_hash, `step ${r.step}: equal parameters`)
      const full = common.filter((r) => r.applied === 2)
      assert.ok(full.length >= 1, `a round applied both clients' results: ${JSON.stringify(common)}`)
      assert.notEqual(common[0].param_hash, common.at(-1)!.param_hash, 'the model changed')
      // Both replicas report the same validation loss after the same step (held-out split, same parameters).
      const val = (r: object) => (r as {val_loss?: number | null}).val_loss
      const evaluated = common.filter((r) => typeof val(r) === 'number')
      assert.ok(evaluated.length >= 1, `an evaluated round: ${JSON.stringify(common.map((r) => [r.step, val(r)]))}`)
      for (const r of evaluated) {
        assert.equal(r.step % 2, 0)
        assert.equal(val(r), val(rounds[1].find((q) => q.step === r.step)!), `step ${r.step}: equal validation loss`)
        assert.ok(val(r)! > 0 && val(r)! < 20)
      }

      // Points: the server's own dashboard joins its rewards ledger (accepted batches this epoch, weight 1 without
      // verifiers), as `psyche dashboard --server-addr` does; it once showed 0 for every client.
      const status = (await (await fetch(new URL('/api/status', dash.url))).json()) as {clients: {id: string; earned: number; pending_points: number}[]}
      for (const id of ids) {
        const row = status.clients.find((c) => c.id === id)
        assert.ok(row && row.earned + row.pending_points > 0, `points for ${id}: ${JSON.stringify(status.clients)}`)
      }

      // Prometheus: the server's and every client's endpoint, scraped while the run goes on.
      const sm = (await scrape(serverMetrics.port)).metrics
      assert.ok(sm.get('psyche_coordinator_step')! >= 2)
      assert.ok(sm.get('psyche_coordinator_round_duration_seconds_count')! >= 1)
      assert.ok(sm.get('psyche_coordinator_client_reports_total')! >= 2)
      assert.equal(sm.get('psyche_coordinator_connections'), 2)
      for (const [i, p] of clientMetricPorts.entries()) {
        const m = (await scrape(p)).metrics
        assert.ok(m.get('psyche_client_rounds_applied_total')! >= 1, 'rounds applied')
        assert.ok(m.get('psyche_client_step')! >= 1)
        assert.ok(m.get('psyche_client_loss')! > 0)
        assert.ok(m.get('psyche_client_validation_loss')! > 0, 'the validation loss')
        assert.ok(m.get('psyche_client_eval_duration_seconds_count')! >= 1)
        assert.ok(m.get('psyche_client_tokens_per_second')! > 0)
        assert.ok(m.get('psyche_client_compute_duration_seconds_count')! >= 1)
        assert.ok(m.get('psyche_client_result_size_bytes_count')! >= 1)
        assert.ok(m.get('psyche_client_produce_duration_seconds_count')! >= 1, 'produce times')
        assert.ok(m.get('psyche_client_apply_duration_seconds_count')! >= 1, 'apply times')
        assert.ok(m.get('psyche_p2p_received_bytes_total')! > 0, "downloaded the peer's results")
        assert.ok(m.get('psyche_client_results_applied')! >= 1)
        // Bytes per peer: the other client's results came from it (labelled by its id's first 16 characters).
        const other = ids[1 - i].slice(0, 16)
        assert.ok(m.get(`psyche_p2p_peer_received_bytes_total{peer="${other}"}`)! > 0, `bytes received from ${other}`)
        assert.equal(m.get('psyche_worker_restarts_total'), 0)
      }

      // A reload shows the history at once (from the server, not the page's memory).
      const before = await seen(page)
      await page.reload()
      await until(page, (s) => s.loss >= before.loss && s.rows.length === 2 && s, 'the history after a reload', 20_000)

      // The run finishes; a restarted server (same --save-state-dir) serves the same history to a new page.
      for (const c of clients) await c.waitFor((e) => e.event === 'finished', 'the run to finish', 240_000)
      await page.reload()
      const end = await until(page, (s) => s.phase === 'Finished' && s, 'Finished', 30_000)
      await server.stop()
      const again = new JsonProcess('server-2', serverArgs)
      procs.push(again)
      const dash2 = (await again.waitFor((e) => e.event === 'dashboard_listening', 'the restarted dashboard', 60_000)) as {url: string}
      const page2 = await browser.newPage({viewport: {width: 1280, height: 1000}})
      await page2.goto(dash2.url)
      const restored = await until(page2, (s) => s.loss >= end.loss && s.bluePixels > 20 && s, 'the saved history', 20_000)
      assert.equal(restored.round, end.round)
      assert.ok(restored.loss >= 4, `loss points of rounds 1..12 (some clients report late): ${restored.loss}`)
    })
  },
)
