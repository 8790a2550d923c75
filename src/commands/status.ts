import {Flags} from '@oclif/core'
import {CoordinatorConnection} from '../core/backend/index.js'
import {readMetadata, readRunLedger, withClaims} from '../core/backend/solana/admin.js'
import {RpcChain} from '../core/backend/solana/chain.js'
import {coordinatorAddress, peerAddress} from '../core/backend/solana/instructions.js'
import {addressOfClient, ledgerRows, ledgerScores} from '../core/backend/solana/layout.js'
import {parseAddress} from '../core/cli/solana-flags.js'
import {PsycheError} from '../core/errors.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {checkpointNotSavedText, coordinatorSeconds, saveStatusText, summarizeRun, timeLeftText, type RunSummary} from '../core/obs/summary.js'
import {generateIdentity} from '../core/protocol/index.js'
import type {ClientScore, SaveStatus} from '../core/protocol/messages.js'
import type {RewardRow} from '../core/coordinator/rewards.js'

export default class Status extends PsycheCommand {
  static summary = 'Print a one-shot summary of a run: its phase, round, epoch, progress, clients and witness quorum'
  static description = `Connects to the coordinator (psyche server run) as a watcher — it does not join — reads the run's current
state, prints it and exits. With --json, one object: {run_id, run_state, epoch, step, total_steps, progress,
phase_elapsed_seconds, phase_time_left_seconds (a round's is its timeout), epoch_time_left_seconds, clients: [{id, state}], clients_by_state: {healthy, dropped,
withdrawn, ejected, pending}, round: {step, height, batch_size, trainers, witnesses_expected, witness_proofs,
witness_quorum} | null, pause_pending, model_wanted: {step, param_hash, detail} | null (the run waits: no member holds its
current model, nor a checkpoint of it), peers, scores: [{client_id, average, last, last_step, verifiers, count}],
rewards: [{client_id, score, weight, rounds, batches, pending, earned, slashed}], no_exchange: [{client_id, rounds, step}],
save_state: {ok, failures_in_a_row, failures, max_failures, last_error, last_saved_step, last_saved_at} | null,
checkpoint_save_failed: [{client_id, step, message}]}:
save_state is how the server's saves of its state go (null: it runs without --save-state-dir; text: STATE NOT SAVED
while they fail);
no_exchange lists the clients whose latest round report says they applied none of the others' results for that many
rounds in a row (they reach no peer and train alone; text: NO EXCHANGE on the client's line); checkpoint_save_failed
lists the clients whose last checkpoint save (join --checkpoint-dir, or a checkpointer's) failed, until a later one
succeeds (text: CHECKPOINT NOT SAVED on the client's line). scores are the moving averages of the
verification scores verifiers reported for each client's results; rewards are the points each client earned for its
accepted results (psyche rewards shows them alone).

With --rpc (and --program-id, --run-id) it reads a run on Solana instead: its coordinator account, its peer records and
its metadata (adding coordinator, main_authority, join_authority, name and description) and the rewards ledger the
program keeps in the coordinator account: rewards as psyche rewards --rpc shows them (claimed, from the treasurer
program's records, with --treasurer-id), and scores the moving averages of the scores verifiers reported to the
program (report_scores).`

  static examples = [
    '<%= config.bin %> status --server-addr 127.0.0.1:20000',
    '<%= config.bin %> status --server-addr host:20000 --json',
    '<%= config.bin %> status --rpc http://127.0.0.1:8899 --program-id <ID> --run-id my-run',
  ]

  static flags = {
    'server-addr': Flags.string({summary: 'the coordinator server, host:port', exactlyOne: ['server-addr', 'rpc']}),
    rpc: Flags.string({summary: 'a run on Solana: JSON-RPC URL of the cluster (several, comma-separated)', exactlyOne: ['server-addr', 'rpc'], env: 'PSYCHE_SOLANA_RPC'}),
    'program-id': Flags.string({summary: 'Solana: the coordinator program', env: 'PSYCHE_COORDINATOR_PROGRAM', dependsOn: ['rpc']}),
    'treasurer-id': Flags.string({summary: 'Solana: the treasurer program (claimed points)', env: 'PSYCHE_TREASURER_PROGRAM', dependsOn: ['rpc']}),
    'run-id': Flags.string({summary: 'expect this run (default: whichever run the server coordinates); required with --rpc'}),
    timeout: Flags.integer({summary: 'seconds to keep trying to reach the server', default: 5, min: 1}),
  }

  async run(): Promise<StatusSummary> {
    const {flags} = await this.parse(Status)
    if (flags.rpc) {
      const summary = await solanaStatus(flags.rpc, flags['program-id'], flags['treasurer-id'], flags['run-id'])
      if (!this.jsonEnabled()) for (const line of formatSummary(summary)) this.log(line)
      return summary
    }
    const conn = await CoordinatorConnection.connect({
      addr: flags['server-addr']!,
      runId: flags['run-id'] ?? '',
      identity: generateIdentity(),
      p2pAddrs: [],
      join: false,
      reconnect: false,
      connectTimeoutMs: flags.timeout * 1000,
    })
    const summary: StatusSummary = {
      ...summarizeRun(conn.state!, coordinatorSeconds(conn.serverTime ?? Date.now() / 1000)),
      peers: Object.values(conn.peers).filter((a) => a.length > 0).length,
      scores: conn.scores,
      rewards: conn.rewards,
      save_state: conn.saveState ?? null,
      no_exchange: [...conn.latestReports.values()]
        .filter((r) => (r.report.rounds_without_exchange ?? 0) > 0)
        .map((r) => ({client_id: r.client, rounds: r.report.rounds_without_exchange!, step: r.step})),
      checkpoint_save_failed: [...conn.latestReports.values()].flatMap((r) =>
        r.report.checkpoint_save_failed ? [{client_id: r.client, step: r.report.checkpoint_save_failed.step, message: r.report.checkpoint_save_failed.message}] : [],
      ),
    }
    await conn.close()
    if (!this.jsonEnabled()) for (const line of formatSummary(summary)) this.log(line)
    return summary
  }
}

export type StatusSummary = RunSummary & {
  peers: number
  scores?: ClientScore[]
  /** Points per client; a run on Solana adds what each has claimed. */
  rewards?: (RewardRow & {claimed?: number | null})[]
  /**
   * Clients whose latest report says they applied none of the others' results for `rounds` rounds in a row (they
   * reach no peer: they train alone), as of round `step`.
   */
  no_exchange?: {client_id: string; rounds: number; step: number}[]
  /** Clients whose latest report says their last checkpoint save failed: at which step, and why. */
  checkpoint_save_failed?: {client_id: string; step: number; message: string}[]
  /** A server that saves its state (--save-state-dir): how its saves are going (null: it saves nothing). */
  save_state?: SaveStatus | null
  /** A run on Solana: its coordinator account, authorities and metadata. */
  coordinator?: string
  main_authority?: string
  join_authority?: string | null
  name?: string | null
  description?: string | null
}

/** A run on Solana as its accounts show it: the coordinator's state and rewards ledger, its peer records, its metadata. */
async function solanaStatus(rpc: string, program: string | undefined, treasurer: string | undefined, runId: string | undefined): Promise<StatusSummary> {
  if (!runId) throw new PsycheError('--run-id is required with --rpc', {code: 'EUSAGE'})
  const chain = new RpcChain(rpc)
  const programId = parseAddress(program, 'program-id')
  const target = {chain, programId, runId, treasurer: treasurer === undefined ? undefined : parseAddress(treasurer, 'treasurer-id')}
  const {run, ledger} = await readRunLedger(target)
  const coordinator = await coordinatorAddress(programId, runId)
  const ids = new Set([...run.state.epoch.clients.map((c) => c.id), ...run.state.pending])
  let peers = 0
  for (const id of ids) if (await chain.fetchAccount(await peerAddress(programId, coordinator, addressOfClient(id)))) peers++
  const metadata = await readMetadata(target)
  return {
    ...summarizeRun(run.state, Date.now() / 1000),
    peers,
    scores: ledgerScores(ledger),
    rewards: await withClaims(target, ledgerRows(ledger, run.state)),
    coordinator,
    main_authority: run.main_authority,
    join_authority: run.join_authority,
    name: metadata?.name ?? null,
    description: metadata?.description ?? null,
  }
}

export function formatSummary(s: StatusSummary): string[] {
  const left = timeLeftText(s) ? `, ${timeLeftText(s)}` : ''
  const c = s.clients_by_state
  const lines = [
    ...(s.coordinator
      ? [
          `run ${s.run_id} on Solana${s.name ? ` (${s.name})` : ''}: coordinator ${s.coordinator}, main authority ${s.main_authority}${s.join_authority ? `, join authority ${s.join_authority}` : ''}`,
        ]
      : []),
    `run ${s.run_id}: ${s.run_state} (${s.phase_elapsed_seconds}s in phase${left})`,
    `epoch ${s.epoch}, step ${s.step} of ${s.total_steps} (${(s.progress * 100).toFixed(1)}%)`,
    `clients: ${c.healthy} healthy, ${c.dropped} dropped, ${c.withdrawn} withdrawn, ${c.ejected} ejected, ${c.pending} waiting for the next epoch; ${s.peers} in the peer directory`,
  ]
  if (s.round)
    lines.push(
      `round ${s.round.step} (height ${s.round.height}): ${s.round.trainers} trainers${s.round.members > s.round.trainers ? ` of ${s.round.members} members` : ''}, batch ${s.round.batch_size}, witness proofs ${s.round.witness_proofs}/${s.round.witnesses_expected} (quorum ${s.round.witness_quorum})`,
    )
  if (s.pause_pending) lines.push('a pause is pending (at the end of the epoch)')
  const unsaved = s.save_state ? saveStatusText(s.save_state) : null
  if (unsaved) lines.push(unsaved)
  if (s.model_wanted) lines.push(`waiting: ${s.model_wanted.detail}`)
  const scores = new Map((s.scores ?? []).map((x) => [x.client_id, x]))
  const rewards = new Map((s.rewards ?? []).map((x) => [x.client_id, x]))
  const alone = new Map((s.no_exchange ?? []).map((x) => [x.client_id, x]))
  const unsavedCheckpoints = new Map((s.checkpoint_save_failed ?? []).map((x) => [x.client_id, x]))
  for (const client of s.clients) {
    const sc = scores.get(client.id)
    const r = rewards.get(client.id)
    const a = alone.get(client.id)
    const noExchange = a ? `  NO EXCHANGE: none of its peers' results for ${a.rounds} round${a.rounds === 1 ? '' : 's'} (to step ${a.step})` : ''
    const f = unsavedCheckpoints.get(client.id)
    const unsaved = f ? `  ${checkpointNotSavedText(f)}` : ''
    const points = r
      ? `  points ${r.earned} earned${r.pending ? ` + ${r.pending} this epoch` : ''}${r.slashed ? `, ${r.slashed} slashed` : ''}${r.claimed ? `, ${r.claimed} claimed` : ''}`
      : ''
    lines.push(
      `  ${client.id.slice(0, 16)}…  ${client.state}${sc ? `  score ${sc.average.toFixed(3)} (${sc.count} reports, last step ${sc.last_step})` : ''}${points}${noExchange}${unsaved}`,
    )
  }
  return lines
}
