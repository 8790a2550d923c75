import {Flags} from '@oclif/core'
import {readRunLedger, setRates} from '../core/backend/solana/admin.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../core/cli/solana-flags.js'
import {constant} from '../core/layout/layout-table.js'
import {POINTS_PER_BATCH} from '../core/coordinator/rewards.js'

interface RatesSummary {
  run_id: string
  /** The rates of the current epoch, and those the next one starts with. */
  points_per_batch: number
  token_rate: number
  next: {points_per_batch: number; token_rate: number} | null
}

export default class SetRates extends PsycheCommand {
  static summary = "Set a Solana run's reward rates from its next epoch on (main authority only)"
  static description = `Points per accepted batch at full weight (default ${POINTS_PER_BATCH}; at most ${constant('MAX_POINTS_PER_BATCH')}), and the token base units a claim will
pay per point (at most ${constant('MAX_TOKEN_RATE')}; 0: nothing to claim). The epoch under way keeps its rates: the new
ones take effect when the next epoch begins (as Psyche's set_future_epoch_rates), so nobody's points for work already
done change. A second set-rates before then replaces the first.

Claims are paid by the treasurer program, from the run's treasury: psyche rewards fund creates and funds it, psyche
rewards claim claims.

--json prints {run_id, points_per_batch, token_rate, next: {points_per_batch, token_rate}}.`

  static examples = ['<%= config.bin %> set-rates --program-id <ID> --run-id my-run --points-per-batch 1000 --token-rate 5']

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
    'points-per-batch': Flags.integer({summary: 'points per accepted batch at full weight', required: true, min: 0, max: constant('MAX_POINTS_PER_BATCH')}),
    'token-rate': Flags.integer({summary: 'token base units a claim pays per point', default: 0, min: 0, max: constant('MAX_TOKEN_RATE')}),
  }

  async run(): Promise<RatesSummary> {
    const {flags} = await this.parse(SetRates)
    const {chain, signer} = await solanaContext(flags)
    const target = {chain, programId: parseAddress(flags['program-id'], 'program-id'), runId: flags['run-id']}
    await setRates({...target, authority: signer, pointsPerBatch: flags['points-per-batch'], tokenRate: flags['token-rate']})
    const {ledger} = await readRunLedger(target)
    const summary = {
      run_id: flags['run-id'],
      points_per_batch: ledger.points_per_batch,
      token_rate: ledger.token_rate,
      next: ledger.next,
    }
    if (!this.jsonEnabled())
      this.log(
        `run ${flags['run-id']}: ${ledger.points_per_batch} points per batch and ${ledger.token_rate} token units per point this epoch` +
          (ledger.next ? `; from the next epoch on ${ledger.next.points_per_batch} and ${ledger.next.token_rate}` : ''),
      )
    return summary
  }
}
