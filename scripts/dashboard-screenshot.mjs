#!/usr/bin/env node
// Regenerates docs/dashboard.png, the README's picture of the dashboard: a real run of the tiny-demo template
// (a coordinator with --dashboard-port and three clients on this machine) photographed in headless Chromium
// after --rounds rounds. Usage: node scripts/dashboard-screenshot.mjs [--rounds 25] [--out docs/dashboard.png]
import {spawn} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {chromium} from 'playwright-core'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const arg = (name, fallback) => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : fallback
}
const rounds = Number(arg('--rounds', '25'))
const out = arg('--out', join(root, 'docs', 'dashboard.png'))
const template = join(root, 'templates', 'tiny-demo', 'state.toml')
// The run starts with all three clients (init_min_clients = 3), so the first to connect does not train alone for an
// epoch; written next to the template so its relative paths resolve, and removed at the end.
const state = join(root, 'templates', 'tiny-demo', `.screenshot-${process.pid}-state.toml`)
writeFileSync(state, readFileSync(template, 'utf8').replace(/^init_min_clients\s*=.*$/m, 'init_min_clients = 3'))
const saveDir = mkdtempSync(join(tmpdir(), 'psyche-screenshot-'))
const children = []

/** A CLI process whose --json lines are handed to onEvent. */
function cli(args, onEvent) {
  const child = spawn(process.execPath, [join(root, 'bin', 'psyche.js'), ...args, '--json'], {cwd: root, stdio: ['ignore', 'pipe', 'inherit']})
  children.push(child)
  let partial = ''
  child.stdout.setEncoding('utf8')
  child.stdout.on('data', (chunk) => {
    const lines = (partial + chunk).split('\n')
    partial = lines.pop()
    for (const line of lines) {
      try {
        onEvent(JSON.parse(line))
      } catch {}
    }
  })
  return child
}

const stop = async () => {
  await Promise.all(
    children.map((c) =>
      c.exitCode !== null
        ? undefined
        : new Promise((resolve) => {
            c.once('exit', resolve)
            c.kill('SIGTERM')
          }),
    ),
  )
  rmSync(saveDir, {recursive: true, force: true})
  rmSync(state, {force: true})
}
process.on('SIGINT', () => stop().then(() => process.exit(130)))

try {
  const dashboard = await new Promise((resolve) => {
    let port
    cli(['server', 'run', '--state', state, '--save-state-dir', saveDir, '--dashboard-port', '0'], (e) => {
      if (e.event === 'listening') {
        port = e.port
        for (let i = 0; i < 3; i++) cli(['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'tiny-demo', '--config', state, '--threads', '1', '--eval-every', '5'], () => {})
      }
      if (e.event === 'dashboard_listening') resolve(e.url)
    })
  })
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run'],
  })
  const page = await browser.newPage({viewport: {width: 1200, height: 860}})
  await page.goto(dashboard)
  process.stderr.write(`dashboard at ${dashboard}; waiting for ${rounds} rounds\n`)
  for (;;) {
    const step = await page.evaluate(() => Number(document.getElementById('round').textContent.split(' / ')[0]))
    if (step > rounds) break
    await new Promise((r) => setTimeout(r, 2000))
  }
  await new Promise((r) => setTimeout(r, 1500))
  await page.screenshot({path: out})
  await browser.close()
  process.stderr.write(`wrote ${out}\n`)
} finally {
  await stop()
}
