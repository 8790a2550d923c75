import {readFileSync} from 'node:fs'
import {createServer} from 'node:http'
import {createRequire} from 'node:module'
import {dirname, join} from 'node:path'
import {PsycheError} from '../errors.js'
import type {RewardRow} from '../coordinator/rewards.js'
import type {SaveStatus} from '../protocol/messages.js'
import type {ClientRow, HistoryPoint} from './history.js'
import type {RunSummary} from './summary.js'
import {DASHBOARD_HTML, DASHBOARD_JS} from './dashboard-page.js'

/** A dashboard row per client: its standing in the run and its latest report. */
interface DashboardClient {
  id: string
  state: string
  connected: boolean
  step: number | null
  loss: number | null
  tokens_per_second: number | null
  bytes_in: number | null
  bytes_out: number | null
  peers: number | null
  /** Rounds in a row it applied none of the others' results (a client that exchanges with no peer); null: no report. */
  rounds_without_exchange: number | null
  /** Its last checkpoint save failed: the step and why (null: none failed since its last good save, or no report). */
  checkpoint_save_failed: {step: number; message: string} | null
  /** Its verification score (moving average; null: not scored), and its points: earned, pending this epoch, slashed. */
  score: number | null
  earned: number
  pending_points: number
  slashed: number
}

/** What the dashboard shows; read on every request. */
interface DashboardSource {
  summary(): RunSummary
  history(sinceStep?: number): HistoryPoint[]
  clients(): DashboardClient[]
  /** A server that saves its state: how its saves are going (absent or null: it saves nothing, or nothing is known). */
  saveState?(): SaveStatus | null | undefined
}

/** The table of clients: every client of the epoch and every pending one, joined with their latest reports and rewards. */
export function clientTable(summary: RunSummary, pending: string[], connected: string[], rows: ClientRow[], rewards: RewardRow[] = []): DashboardClient[] {
  const byId = new Map(rows.map((r) => [r.id, r]))
  const points = new Map(rewards.map((r) => [r.client_id, r]))
  const online = new Set(connected)
  // A healthy client of this epoch is also pending for the next one: one row each, its epoch state first.
  const seen = new Set<string>()
  const list = [...summary.clients, ...pending.map((id) => ({id, state: 'Pending'}))].filter((c) => !seen.has(c.id) && seen.add(c.id))
  return list.map(({id, state}) => {
    const r = byId.get(id)
    const p = points.get(id)
    return {
      id,
      state,
      connected: online.has(id),
      step: r?.step ?? null,
      loss: r?.loss ?? null,
      tokens_per_second: r?.tokens_per_second ?? null,
      bytes_in: r?.bytes_in ?? null,
      bytes_out: r?.bytes_out ?? null,
      peers: r?.peers ?? null,
      rounds_without_exchange: r?.rounds_without_exchange ?? null,
      checkpoint_save_failed: r?.checkpoint_save_failed ?? null,
      score: p?.score ?? null,
      earned: p?.earned ?? 0,
      pending_points: p?.pending ?? 0,
      slashed: p?.slashed ?? 0,
    }
  })
}

/** uPlot's files, from the installed package (no CDN). */
function uplotAssets(): {js: Buffer; css: Buffer} {
  const require = createRequire(import.meta.url)
  const dir = join(dirname(require.resolve('uplot/package.json')), 'dist')
  return {js: readFileSync(join(dir, 'uPlot.iife.min.js')), css: readFileSync(join(dir, 'uPlot.min.css'))}
}

/** The dashboard's HTTP server: the page, its assets, and /api/status and /api/history as JSON. */
export async function serveDashboard(source: DashboardSource, opts: {port: number; host?: string}): Promise<{port: number; url: string; close: () => Promise<void>}> {
  const assets = uplotAssets()
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://localhost')
    const send = (status: number, type: string, body: string | Buffer) => res.writeHead(status, {'content-type': type, 'cache-control': 'no-store'}).end(body)
    if (req.method !== 'GET') return send(405, 'text/plain', 'GET only\n')
    try {
      switch (url.pathname) {
        case '/':
          return send(200, 'text/html; charset=utf-8', DASHBOARD_HTML)
        case '/dashboard.js':
          return send(200, 'text/javascript; charset=utf-8', DASHBOARD_JS)
        case '/uPlot.iife.min.js':
          return send(200, 'text/javascript; charset=utf-8', assets.js)
        case '/uPlot.min.css':
          return send(200, 'text/css; charset=utf-8', assets.css)
        case '/api/status':
          return send(200, 'application/json', JSON.stringify({summary: source.summary(), clients: source.clients(), save_state: source.saveState?.() ?? null}))
        case '/api/history': {
          const since = Number(url.searchParams.get('since') ?? '-1')
          return send(200, 'application/json', JSON.stringify({points: source.history(Number.isFinite(since) ? since : -1)}))
        }
        default:
          return send(404, 'text/plain', 'not found\n')
      }
    } catch (error) {
      return send(500, 'text/plain', `${(error as Error).message}\n`)
    }
  })
  const host = opts.host ?? '127.0.0.1'
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) =>
      reject(new PsycheError(`--dashboard-port: cannot listen on ${host}:${opts.port}: ${error.code ?? error.message}`, {cause: error})),
    )
    server.listen(opts.port, host, () => resolve())
  })
  const address = server.address()
  const port = typeof address === 'object' && address ? address.port : opts.port
  return {
    port,
    url: `http://${host.includes(':') ? `[${host}]` : host}:${port}/`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}
