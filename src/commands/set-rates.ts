import {Flags} from '@oclif/core'
import {readRunLedger, setRates, setTreasury} from '../core/backend/solana/admin.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {coordinatorAddress, treasuryAddress} from '../core/backend/solana/instructions.js'
import {parseAddress, solanaContext, solanaFlags} from '../core/cli/solana-flags.js'
import {constant} from '../core/coordinator/layout-table.js'
import {POINTS_PER_BATCH} from '../core/coordinator/rewards.js'

interface RatesSummary {
  run_id: string
  /** The rates of the current epoch, and those the next one starts with. */
  points_per_batch: number
  token_rate: number
  next: {points_per_batch: number; token_rate: number} | null
  /** The SPL token mint claims pay in (null: none). */
  treasury_mint: string | null
}

export default class SetRates extends PsycheCommand {
  static summary = "Set a Solana run's reward rates from its next epoch on (main authority only)"
  static description = `Points per accepted batch at full weight (default ${POINTS_PER_BATCH}; at most ${constant('MAX_POINTS_PER_BATCH')}), and the token base units a claim will
pay per point (at most ${constant('MAX_TOKEN_RATE')}; 0: nothing to claim). The epoch under way keeps its rates: the new
ones take effect when the next epoch begins (as Psyche's set_future_epoch_rates), so nobody's points for work already
done change. A second set-rates before then replaces the first.

--treasury-mint MINT names the SPL token claims pay in (psyche rewards claim): the treasury is any token account of that
mint owned by the run's treasury address (printed here), which the authority funds with ordinary token transfers.

--json prints {run_id, points_per_batch, token_rate, next: {points_per_batch, token_rate}, treasury_mint,
treasury_authority}.`

  static examples = ['<%= config.bin %> set-rates --program-id <ID> --run-id my-run --points-per-batch 1000 --token-rate 5']

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
    'points-per-batch': Flags.integer({summary: 'points per accepted batch at full weight', required: true, min: 0, max: constant('MAX_POINTS_PER_BATCH')}),
    'token-rate': Flags.integer({summary: 'token base units a claim pays per point', default: 0, min: 0, max: constant('MAX_TOKEN_RATE')}),
    'treasury-mint': Flags.string({summary: 'the SPL token mint claims pay in'}),
  }

  async run(): Promise<RatesSummary & {treasury_authority: string}> {
    const {flags} = await this.parse(SetRates)
    const {chain, signer} = await solanaContext(flags)
    const target = {chain, programId: parseAddress(flags['program-id'], 'program-id'), runId: flags['run-id']}
    if (flags['treasury-mint']) await setTreasury({...target, authority: signer, mint: parseAddress(flags['treasury-mint'], 'treasury-mint')})
    await setRates({...target, authority: signer, pointsPerBatch: flags['points-per-batch'], tokenRate: flags['token-rate']})
    const {ledger} = await readRunLedger(target)
    const treasuryAuthority = await treasuryAddress(target.programId, await coordinatorAddress(target.programId, target.runId))
    const summary = {
      run_id: flags['run-id'],
      points_per_batch: ledger.points_per_batch,
      token_rate: ledger.token_rate,
      next: ledger.next,
      treasury_mint: ledger.treasury_mint,
      treasury_authority: treasuryAuthority,
    }
    if (!this.jsonEnabled())
      this.log(
        `run ${flags['run-id']}: ${ledger.points_per_batch} points per batch and ${ledger.token_rate} token units per point this epoch` +
          (ledger.next ? `; from the next epoch on ${ledger.next.points_per_batch} and ${ledger.next.token_rate}` : '') +
          (ledger.treasury_mint ? `\nclaims pay in ${ledger.treasury_mint} from a token account owned by ${treasuryAuthority}` : ''),
      )
    return summary
  }
}
