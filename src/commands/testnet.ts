import {Flags} from '@oclif/core'
import {PsycheCommand} from '../core/cli/base-command.js'
import {Progress} from '../core/cli/progress.js'
import {runConfigPath, runTestnet, type TestnetSummary} from '../core/testnet/index.js'
import {ensureDemoCorpus} from '../core/corpus.js'
import {PsycheError} from '../core/errors.js'
import {CoordinatorConnection} from '../core/backend/index.js'
import type {CoordinatorState} from '../core/coordinator/types.js'
import {RunHistory} from '../core/obs/history.js'
import {coordinatorSeconds, summarizeRun} from '../core/obs/summary.js'
import {historyFigures, startTerminalView, Warnings} from '../core/obs/terminal-view.js'
import {watchRun} from '../core/obs/watch.js'
import {generateIdentity} from '../core/protocol/index.js'

export default class Testnet extends PsycheCommand {
  static summary = 'Run a coordinator and N clients on this machine, as separate processes, and watch them train together'
  static description = `Starts \`psyche server run\` (or, with --backend solana, the Solana coordinator program in a localnet:
the run is created, configured and resumed on it, and the clients join with --rpc) and N \`psyche join\` processes
for the run in --config (a run directory with state.toml), shows one status view (a live line on a terminal, plain lines otherwise, nothing with --json),
optionally kills K random clients every S seconds and restarts them, and ends with a summary. With --json the
summary is one object: {run_id, clients, rounds: [{step, epoch, clients: {name: {loss, param_hash}}, hashes_equal}],
kills, rejoins, bytes: {name: {in, out}}, speculation: {name: {used, discarded}}, result_bytes_per_round, wall_seconds, ended}.`

  static examples = [
    '<%= config.bin %> testnet --clients 3 --config templates/tiny-demo --rounds 10',
    '<%= config.bin %> testnet --clients 4 --config run --random-kill-num 1 --random-kill-interval 40 --json',
  ]

  static flags = {
    clients: Flags.integer({summary: 'how many clients to start', required: true, min: 1}),
    config: Flags.string({char: 'c', summary: 'run directory with state.toml (or the state.toml itself)', required: true}),
    rounds: Flags.integer({summary: 'stop once every live client has applied this many rounds (default: until the run is Finished)', min: 1}),
    'random-kill-num': Flags.integer({
      summary: 'kill this many random clients every --random-kill-interval seconds, then restart them (none once a client has reached --rounds)',
      default: 0,
      min: 0,
    }),
    'random-kill-interval': Flags.integer({summary: 'seconds between random kills', default: 30, min: 1}),
    'kill-after-step': Flags.integer({
      summary: 'once every client has applied this round, kill --random-kill-num random clients (at least 1) in the next one, once, then restart them',
      min: 1,
    }),
    threads: Flags.integer({summary: 'torch threads per client worker (default 1)', default: 1, min: 1}),
    shard: Flags.string({summary: "shards per client, client-0 first (join --shard): 2,1,1 holds client-0's model in 2 shards (FSDP2, 2 ranks)"}),
    timeout: Flags.integer({summary: 'give up after this many seconds', default: 900, min: 1}),
    backend: Flags.string({
      summary: 'the coordinator: psyche server run (centralized), or the Solana program in a localnet in this process (solana)',
      options: ['centralized', 'solana'],
      default: 'centralized',
    }),
    'eval-every': Flags.integer({summary: "the clients' validation loss on held-out samples after every N-th round (join --eval-every; 0: never)", min: 0}),
  }

  async run(): Promise<TestnetSummary> {
    const {flags} = await this.parse(Testnet)
    // On a terminal: a live view (ink) of the run, watched through the coordinator; piped: plain lines; --json: the summary only.
    const liveView = !this.plain
    const progress = Progress.for({json: this.jsonEnabled() || liveView})
    const watched: {conn?: CoordinatorConnection; history?: RunHistory; state?: () => CoordinatorState; port?: number} = {}
    const rows = new Map<string, {state: string; step: number | null; loss: number | null; note?: string}>()
    const warnings = new Warnings()
    const notes = new Warnings()
    let view: {stop: () => void} | undefined
    runConfigPath(flags.config) // a missing run directory fails before anything starts
    // Prepare the bundled corpus once, before N clients would race to build it.
    if (!this.jsonEnabled()) progress.status('preparing the demo corpus')
    await ensureDemoCorpus(() => {})
    const latest = new Map<string, {step: number; loss: number | null; hash: string}>()
    const reported = new Set<number>()
    const live = new Set<string>()
    const byStep = new Map<number, Map<string, {loss: number | null; hash: string}>>()
    const epochs = new Map<number, number>()
    const line = () => {
      const parts = [...latest.entries()]
        .sort()
        .map(([name, r]) => `${name.replace('client-', 'c')}: ${r.step} ${r.loss === null ? '  -  ' : r.loss.toFixed(3)} ${r.hash.slice(0, 8)}`)
      return parts.join(' | ')
    }
    // Ctrl-C / SIGTERM: stop every process, then print the summary and exit with the signal's code.
    const interrupt = new AbortController()
    void this.shutdown.requested().then(() => interrupt.abort())
    const summary = await runTestnet({
      signal: interrupt.signal,
      clients: flags.clients,
      backend: flags.backend as 'centralized' | 'solana',
      config: flags.config,
      rounds: flags.rounds,
      randomKillNum: flags['random-kill-num'],
      randomKillInterval: flags['random-kill-interval'],
      killAfterStep: flags['kill-after-step'],
      threads: flags.threads,
      shards: flags.shard === undefined ? undefined : parseShards(flags.shard, flags.clients),
      evalEvery: flags['eval-every'],
      timeout: flags.timeout,
      onEvent: (e) => {
        switch (e.kind) {
          case 'server':
            progress.status(`coordinator listening on 127.0.0.1:${e.port}; starting ${flags.clients} clients`)
            if (liveView) {
              watched.port = e.port
              void CoordinatorConnection.connect({addr: `127.0.0.1:${e.port}`, runId: '', identity: generateIdentity(), p2pAddrs: [], join: false}).then(
                (conn) => {
                  watched.conn = conn
                  watched.history = RunHistory.open(conn.runId)
                  watched.state = watchRun(conn, watched.history)
                },
                (error: Error) => warnings.add(`cannot watch the coordinator: ${error.message}`),
              )
              view = startTerminalView(() => {
                const state = watched.state?.()
                const summary = state ? summarizeRun(state, coordinatorSeconds(watched.conn?.serverTime ?? Date.now() / 1000)) : undefined
                return {
                  title: `psyche testnet · ${flags.clients} clients · coordinator 127.0.0.1:${watched.port}`,
                  summary,
                  clients: [...rows.entries()].sort().map(([name, r]) => ({name, ...r})),
                  ...(watched.history ? historyFigures(watched.history.history()) : {losses: []}),
                  peers: null,
                  warnings: warnings.list,
                  notes: notes.list,
                }
              })
            }
            break
          case 'solana':
            progress.status(`coordinator: program ${e.program_id} in a localnet at ${e.url}; starting ${flags.clients} clients`)
            if (liveView) {
              view = startTerminalView(() => ({
                title: `psyche testnet · ${flags.clients} clients · Solana ${e.url}`,
                summary: undefined,
                clients: [...rows.entries()].sort().map(([name, r]) => ({name, ...r})),
                losses: [],
                peers: null,
                warnings: warnings.list,
                notes: notes.list,
              }))
            }
            break
          case 'round': {
            latest.set(e.client, {step: e.step, loss: e.loss, hash: e.param_hash})
            rows.set(e.client, {state: 'training', step: e.step, loss: e.loss, note: `hash ${e.param_hash.slice(0, 8)}`})
            progress.update(line())
            // One line per round: once every live client has applied it, or (a client may be out of the epoch,
            // still loading) once any client moves on to the next round.
            let step = byStep.get(e.step)
            if (!step) byStep.set(e.step, (step = new Map()))
            step.set(e.client, {loss: e.loss, hash: e.param_hash})
            const report = (n: number, epoch: number) => {
              const at = byStep.get(n)
              if (!at || reported.has(n)) return
              reported.add(n)
              const same = [...at.values()]
              const losses = same.map((r) => r.loss).filter((l): l is number => l !== null)
              const mean = losses.length ? (losses.reduce((a, b) => a + b, 0) / losses.length).toFixed(3) : '-'
              const equal = new Set(same.map((r) => r.hash)).size === 1
              progress.note(`round ${n} (epoch ${epoch}): mean loss ${mean}, ${same.length} clients, parameter hashes ${equal ? 'equal' : 'DIFFER'} (${same[0].hash.slice(0, 12)})`)
              byStep.delete(n - 10)
            }
            if (e.step > 1) report(e.step - 1, epochs.get(e.step - 1) ?? e.epoch)
            epochs.set(e.step, e.epoch)
            if ([...live].every((c) => step!.has(c))) report(e.step, e.epoch)
            break
          }
          case 'killed':
            progress.note(`killed ${e.client} after step ${e.after_step ?? '-'}`)
            rows.set(e.client, {...(rows.get(e.client) ?? {step: null, loss: null}), state: 'killed'})
            warnings.add(`killed ${e.client} after step ${e.after_step ?? '-'}`)
            latest.delete(e.client)
            live.delete(e.client)
            break
          case 'client_started':
            live.add(e.client)
            rows.set(e.client, {state: e.generation > 1 ? 'restarted' : 'started', step: null, loss: null})
            if (e.generation > 1) progress.note(`restarted ${e.client}`)
            break
          case 'note':
            progress.note(`${e.client}: ${e.severity === 'info' ? '' : `${e.severity}: `}${e.text}`)
            ;(e.severity === 'info' ? notes : warnings).add(`${e.client}: ${e.text}`)
            break
          case 'exited':
            rows.set(e.client, {...(rows.get(e.client) ?? {step: null, loss: null}), state: 'exited'})
            live.delete(e.client)
            latest.delete(e.client)
            break
        }
      },
    })
    view?.stop()
    await watched.conn?.close()
    if (!this.jsonEnabled()) {
      const first = summary.rounds[0]
      const last = summary.rounds.at(-1)
      const meanLoss = (r: typeof first) => {
        const l = Object.values(r.clients)
          .map((c) => c.loss)
          .filter((x): x is number => x !== null)
        return l.length ? (l.reduce((a, b) => a + b, 0) / l.length).toFixed(3) : '-'
      }
      progress.done(`testnet ${summary.ended} after ${summary.wall_seconds}s`)
      this.log(`rounds: ${summary.rounds.length}${first && last ? `, mean loss ${meanLoss(first)} → ${meanLoss(last)}` : ''}`)
      const v = summary.validation
      if (v.length > 0)
        this.log(
          `validation loss (held-out samples): ${v[0].loss.toFixed(3)} at step ${v[0].step}${v.length > 1 ? ` → ${v.at(-1)!.loss.toFixed(3)} at step ${v.at(-1)!.step}` : ''}`,
        )
      else this.log('validation loss: not measured (join --eval-every 0, or no round reached an evaluation)')
      this.log(`parameter hashes equal in ${summary.rounds.filter((r) => r.hashes_equal).length}/${summary.rounds.length} rounds`)
      // Equal hashes mean nothing when nobody took anyone's results: say so, loudly.
      if (summary.rounds_without_exchange > 0)
        this.log(
          `WARNING: in ${summary.rounds_without_exchange}/${summary.rounds.length} rounds some client applied no other client's results (no exchange: see the clients' no_exchange warnings)`,
        )
      else this.log(`every round applied every client's peers' results`)
      this.log(`kills: ${summary.kills.length}, rejoins: ${summary.rejoins.filter((r) => r.first_step !== null).length}`)
      if (summary.result_bytes_per_round !== null) this.log(`result per client per round: ${summary.result_bytes_per_round} bytes`)
      for (const [name, b] of Object.entries(summary.bytes)) this.log(`${name}: ${(b.in / 1e6).toFixed(2)} MB in, ${(b.out / 1e6).toFixed(2)} MB out`)
    }
    if (summary.ended === 'failed') this.error('the testnet failed: the server or every client exited early', {exit: 1})
    if (flags.clients > 1 && summary.rounds.length > 0 && summary.rounds_without_exchange === summary.rounds.length) {
      this.error(`the testnet failed: in none of its ${summary.rounds.length} rounds did the clients exchange results`, {exit: 1})
    }
    if (summary.ended === 'interrupted') process.exitCode = this.shutdown.exitCode ?? 130
    return summary
  }
}

/** --shard 2,1,1: one whole number ≥ 1 per client at most. */
function parseShards(text: string, clients: number): number[] {
  const shards = text.split(',').map((x) => Number(x.trim()))
  if (shards.some((n) => !Number.isInteger(n) || n < 1)) throw new PsycheError(`--shard ${text}: expected whole numbers ≥ 1, one per client (2,1,1)`)
  if (shards.length > clients) throw new PsycheError(`--shard ${text}: ${shards.length} entries for ${clients} clients`)
  return shards
}
