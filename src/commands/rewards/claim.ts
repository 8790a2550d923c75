import {Flags} from '@oclif/core'
import {claimRewards, readRunLedger} from '../../core/backend/solana/admin.js'
import {clientIdOf} from '../../core/backend/solana/layout.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../../core/cli/solana-flags.js'

interface ClaimSummary {
  run_id: string
  client_id: string
  /** Points paid by this claim, the token base units they paid, and the entry's totals after it. */
  points: number
  amount: number
  earned: number
  claimed: number
}

export default class RewardsClaim extends PsycheCommand {
  static summary = "Claim your points on a Solana run: points × the run's token rate, paid in its treasury mint"
  static description = `Sends claim, signed by --keypair (a client's key: only its own points can be claimed): the program pays the points
earned and not yet claimed × the run's token rate from the run's treasury (--treasury: a token account of the run's
mint owned by its treasury address, see psyche set-rates) to --to (a token account of that mint), by a CPI to the SPL
token program. Claiming twice pays once: a second claim is refused with NothingToClaim.

--json prints {run_id, client_id, points, amount, earned, claimed}.`

  static examples = ['<%= config.bin %> rewards claim --program-id <ID> --run-id my-run --keypair me.json --treasury <TOKEN ACCOUNT> --to <MY TOKEN ACCOUNT>']

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
    treasury: Flags.string({summary: "the run's treasury token account", required: true}),
    to: Flags.string({summary: 'the token account to pay (of the run mint)', required: true}),
  }

  async run(): Promise<ClaimSummary> {
    const {flags} = await this.parse(RewardsClaim)
    const {chain, signer} = await solanaContext(flags)
    const target = {chain, programId: parseAddress(flags['program-id'], 'program-id'), runId: flags['run-id']}
    const id = clientIdOf(signer.address)
    const before = (await readRunLedger(target)).ledger
    const entry = before.entries.find((e) => e.client_id === id)
    await claimRewards({...target, client: signer, treasury: parseAddress(flags.treasury, 'treasury'), destination: parseAddress(flags.to, 'to')})
    const after = (await readRunLedger(target)).ledger.entries.find((e) => e.client_id === id)!
    const points = after.claimed - (entry?.claimed ?? 0)
    const summary = {run_id: flags['run-id'], client_id: id, points, amount: points * before.token_rate, earned: after.earned, claimed: after.claimed}
    if (!this.jsonEnabled()) this.log(`run ${flags['run-id']}: claimed ${points} points, ${summary.amount} token units paid to ${flags.to}`)
    return summary
  }
}
