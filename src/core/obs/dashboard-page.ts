/** The dashboard page: one HTML document and its script. Plots are drawn by uPlot, served by the dashboard itself. */

export const DASHBOARD_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>psyche dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/uPlot.min.css">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1c2430; }
  header { background: #1c2430; color: #fff; padding: 12px 20px; display: flex; gap: 28px; align-items: baseline; flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  header .v { font-weight: 600; font-variant-numeric: tabular-nums; }
  header .k { color: #9fb0c5; margin-right: 4px; }
  main { padding: 16px 20px; display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr)); gap: 16px; }
  section { background: #fff; border-radius: 6px; padding: 10px 12px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
  section h2 { font-size: 14px; margin: 0 0 6px; color: #445; }
  #clients-section { grid-column: 1 / -1; }
  table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e6e8eb; }
  .Healthy { color: #17803d; } .Dropped, .Ejected { color: #b42318; } .Withdrawn, .Pending { color: #8a6d00; }
  #error { color: #b42318; padding: 0 20px; }
  #save-error { background: #b42318; color: #fff; padding: 8px 20px; font-weight: 600; }
  #save-error:empty { display: none; }
  #waiting { color: #8a6d00; padding: 8px 20px 0; font-weight: 600; }
</style>
</head>
<body>
<header>
  <h1>psyche · <span id="run-id">…</span></h1>
  <span><span class="k">phase</span><span class="v" id="phase">…</span></span>
  <span><span class="k">round</span><span class="v" id="round">…</span></span>
  <span><span class="k">epoch</span><span class="v" id="epoch">…</span></span>
  <span><span class="k">time left</span><span class="v" id="time-left">…</span></span>
  <span><span class="k">clients</span><span class="v" id="clients-count">…</span></span>
  <span><span class="k">witnesses</span><span class="v" id="quorum">…</span></span>
  <span><span class="k">loss</span><span class="v" id="loss">…</span></span>
</header>
<div id="save-error"></div>
<div id="waiting"></div>
<div id="error"></div>
<main>
  <section><h2>Loss (train, validation)</h2><div id="plot-loss" class="plot"></div></section>
  <section><h2>Throughput (tokens/s, all clients)</h2><div id="plot-throughput" class="plot"></div></section>
  <section><h2>Round time (s): compute and coordination</h2><div id="plot-time" class="plot"></div></section>
  <section><h2>Participation</h2><div id="plot-participation" class="plot"></div></section>
  <section><h2>P2P bytes per round (MB, all clients)</h2><div id="plot-bytes" class="plot"></div></section>
  <section id="clients-section"><h2>Clients</h2>
    <table><thead><tr><th>client</th><th>state</th><th>connected</th><th>last step</th><th>loss</th><th>tokens/s</th><th>MB in</th><th>MB out</th><th>peers</th><th>score</th><th>points</th></tr></thead>
    <tbody id="clients"></tbody></table>
  </section>
</main>
<script src="/uPlot.iife.min.js"></script>
<script src="/dashboard.js"></script>
</body>
</html>
`

export const DASHBOARD_JS = `'use strict'
const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea']
const points = []
const plots = {}
const charts = [
  {id: 'loss', series: [['train loss', (p) => p.loss], ['validation loss', (p) => p.val_loss]]},
  {id: 'throughput', series: [['tokens/s', (p) => p.tokens_per_second]]},
  {id: 'time', series: [['compute', (p) => p.compute_seconds], ['coordination', (p) => p.coordination_seconds], ['round', (p) => p.round_seconds]]},
  {id: 'participation', series: [['trainers', (p) => p.trainers], ['witness proofs', (p) => p.witnesses], ['reports', (p) => p.reports]]},
  {id: 'bytes', series: [['in', (p) => p.bytes_in / 1e6], ['out', (p) => p.bytes_out / 1e6]]},
]
const $ = (id) => document.getElementById(id)
const fmt = (v, d = 3) => (v === null || v === undefined ? '–' : typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toFixed(d)) : String(v))

function draw() {
  const xs = points.map((p) => p.step)
  for (const c of charts) {
    const data = [xs, ...c.series.map(([, f]) => points.map((p) => { const v = f(p); return v === undefined ? null : v }))]
    const el = $('plot-' + c.id)
    // The number of plotted values, for people (and tests) reading the page's state.
    el.dataset.points = String(data.slice(1).reduce((n, s) => n + s.filter((v) => v !== null).length, 0))
    el.dataset.seriesPoints = data.slice(1).map((s) => s.filter((v) => v !== null).length).join(',')
    if (!plots[c.id]) {
      plots[c.id] = new uPlot({
        width: Math.max(300, el.clientWidth || 440), height: 200,
        scales: {x: {time: false}},
        axes: [{label: 'step'}, {}],
        series: [{label: 'step'}, ...c.series.map(([label], i) => ({label, stroke: COLORS[i], width: 2, points: {show: true, size: 5}, spanGaps: true}))],
      }, data, el)
    } else {
      plots[c.id].setData(data)
    }
  }
}

async function pollHistory() {
  const since = points.length ? points[points.length - 1].step - 8 : -1
  const r = await fetch('/api/history?since=' + since)
  const {points: fresh} = await r.json()
  for (const p of fresh) {
    const i = points.findIndex((q) => q.step === p.step)
    if (i >= 0) points[i] = p
    else points.push(p)
  }
  points.sort((a, b) => a.step - b.step)
  draw()
}

async function pollStatus() {
  const r = await fetch('/api/status')
  const {summary: s, clients, save_state: save} = await r.json()
  $('save-error').textContent = save && !save.ok
    ? 'STATE NOT SAVED: ' + save.failures_in_a_row + ' saves failed in a row (the server halts at ' + save.max_failures + '); ' +
      (save.last_saved_step === null ? 'no state saved yet' : 'the last state saved is step ' + save.last_saved_step) + '; last error: ' + save.last_error
    : ''
  $('run-id').textContent = s.run_id
  $('phase').textContent = s.run_state
  $('waiting').textContent = s.model_wanted ? 'waiting: ' + s.model_wanted.detail : ''
  $('round').textContent = s.step + ' / ' + s.total_steps
  $('epoch').textContent = s.epoch
  $('time-left').textContent = s.phase_time_left_seconds === null ? '–' : s.phase_time_left_seconds.toFixed(0) + ' s'
  const c = s.clients_by_state
  $('clients-count').textContent = c.healthy + ' healthy' + (c.pending ? ', ' + c.pending + ' pending' : '') + (c.dropped + c.ejected ? ', ' + (c.dropped + c.ejected) + ' out' : '')
  $('quorum').textContent = s.round ? s.round.witness_proofs + ' / ' + s.round.witnesses_expected + ' (quorum ' + s.round.witness_quorum + ')' : '–'
  const last = [...points].reverse().find((p) => p.loss !== null)
  $('loss').textContent = last ? last.loss.toFixed(3) : '–'
  const body = $('clients')
  body.replaceChildren(...clients.map((cl) => {
    const tr = document.createElement('tr')
    const cells = [cl.id.slice(0, 16) + '…', cl.state + (cl.checkpoint_save_failed ? ' — CHECKPOINT NOT SAVED (step ' + cl.checkpoint_save_failed.step + '): ' + cl.checkpoint_save_failed.message : ''), cl.connected ? 'yes' : 'no', fmt(cl.step), fmt(cl.loss), fmt(cl.tokens_per_second, 0), cl.bytes_in === null ? '–' : (cl.bytes_in / 1e6).toFixed(2), cl.bytes_out === null ? '–' : (cl.bytes_out / 1e6).toFixed(2), fmt(cl.peers) + (cl.rounds_without_exchange ? ' (no exchange, ' + cl.rounds_without_exchange + ' rounds)' : ''), fmt(cl.score), cl.earned + (cl.pending_points ? ' + ' + cl.pending_points : '') + (cl.slashed ? ' (' + cl.slashed + ' slashed)' : '')]
    cells.forEach((t, i) => { const td = document.createElement('td'); td.textContent = t; if (i === 1) td.className = cl.state; tr.append(td) })
    tr.title = cl.id
    return tr
  }))
}

async function loop() {
  try {
    await Promise.all([pollStatus(), pollHistory()])
    $('error').textContent = ''
  } catch (e) {
    $('error').textContent = 'cannot reach the dashboard server: ' + e.message
  }
  setTimeout(loop, 1000)
}
loop()
`
