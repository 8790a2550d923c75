// Plots of the scale bench: one log-log panel per measure (value over N, with its fitted exponent and the slopes
// of N¹ and N² for reference), drawn as SVG and rendered to PNG by Debian's chromium through playwright-core (as
// scripts/dashboard-screenshot.mjs does). Usage on saved results: node --import tsx bench/scale-plot.ts [results.json]
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {chromium} from 'playwright-core'
import {projectRoot} from '../src/core/worker/python.js'

type Point = {n: number} & Record<string, unknown>
type Metric = {key: string; label: string; unit: string}

function fmt(v: number): string {
  if (v >= 1e9) return `${(v / 1e9).toFixed(1)}G`
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`
  return v >= 10 ? v.toFixed(0) : v.toFixed(1)
}

function panel(points: Point[], m: Metric, slope: number): string {
  const W = 380
  const H = 250
  const L = 62
  const B = 36
  const T = 34
  const R = 14
  const ps = points.map((p) => ({n: p.n, y: p[m.key] as number})).filter((p) => p.y > 0 && Number.isFinite(p.y))
  if (ps.length === 0) return `<svg width="${W}" height="${H}"><text x="10" y="20">${m.label}: no data</text></svg>`
  const nx = ps.map((p) => Math.log10(p.n))
  const ny = ps.map((p) => Math.log10(p.y))
  const x0 = Math.min(...nx) - 0.1
  const x1 = Math.max(...nx) + 0.1
  let y0 = Math.floor(Math.min(...ny) - 0.2)
  let y1 = Math.ceil(Math.max(...ny) + 0.2)
  if (y1 - y0 < 2) y1 = y0 + 2
  if (y1 - y0 > 6) y0 = y1 - 6
  const X = (v: number) => L + ((v - x0) / (x1 - x0)) * (W - L - R)
  const Y = (v: number) => H - B - ((v - y0) / (y1 - y0)) * (H - B - T)
  let g = ''
  for (let e = y0; e <= y1; e++)
    g += `<line x1="${L}" x2="${W - R}" y1="${Y(e)}" y2="${Y(e)}" stroke="#eee"/><text x="${L - 6}" y="${Y(e) + 4}" text-anchor="end" font-size="11">${fmt(10 ** e)}</text>`
  for (const p of ps) g += `<text x="${X(Math.log10(p.n))}" y="${H - B + 16}" text-anchor="middle" font-size="11">${p.n}</text>`
  // Reference slopes through the first point: N (dashed) and N² (dotted).
  const [fx, fy] = [nx[0], ny[0]]
  for (const [k, dash] of [
    [1, '6,4'],
    [2, '2,3'],
  ] as const)
    g += `<line x1="${X(fx)}" y1="${Y(fy)}" x2="${X(x1)}" y2="${Y(fy + k * (x1 - fx))}" stroke="#999" stroke-dasharray="${dash}"/>`
  g += `<polyline fill="none" stroke="#2563eb" stroke-width="2" points="${ps.map((_, i) => `${X(nx[i])},${Y(ny[i])}`).join(' ')}"/>`
  for (let i = 0; i < ps.length; i++) g += `<circle cx="${X(nx[i])}" cy="${Y(ny[i])}" r="3.5" fill="#2563eb"/>`
  const title = `${m.label.trim()}${m.unit ? ` (${m.unit})` : ''}`
  return `<svg width="${W}" height="${H}" font-family="sans-serif"><rect width="${W}" height="${H}" fill="white"/>
<text x="${L}" y="16" font-size="13" font-weight="bold">${title}</text>
<text x="${L}" y="29" font-size="11" fill="#2563eb">∝ N^${Number.isFinite(slope) ? slope.toFixed(2) : '?'}</text>
<text x="${W - R}" y="29" font-size="10" fill="#999" text-anchor="end">- - N¹   ··· N²</text>
${g}<text x="${(L + W - R) / 2}" y="${H - 4}" font-size="11" text-anchor="middle">clients N</text></svg>`
}

export async function plotScale(
  points: Point[] | object[],
  metrics: Metric[],
  exponent: (ps: {n: number; y: number}[]) => number,
  out = join(projectRoot, 'bench', 'scale.png'),
): Promise<void> {
  const ps = (points as Point[]).filter((p) => p.finished !== false)
  const panels = metrics.map((m) => panel(ps, m, exponent(ps.map((p) => ({n: p.n, y: p[m.key] as number})))))
  const html = `<!doctype html><html><body style="margin:0;background:white"><div style="display:flex;flex-wrap:wrap;width:${3 * 380}px">${panels.join('')}</div></body></html>`
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
  })
  try {
    const page = await browser.newPage({viewport: {width: 3 * 380, height: Math.ceil(metrics.length / 3) * 250}})
    await page.setContent(html)
    await page.screenshot({path: out, fullPage: true})
  } finally {
    await browser.close()
  }
  console.log(`wrote ${out}`)
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const {METRICS, exponent} = await import('./scale.bench.js')
  const saved = JSON.parse(readFileSync(process.argv[2] ?? join(projectRoot, 'bench', 'scale-results.json'), 'utf8'))
  await plotScale(saved.points, METRICS as Metric[], exponent)
}
