import {Flags} from '@oclif/core'
import {claimRewards, readClaims, readRunLedger, readTreasury} from '../../core/backend/solana/admin.js'
import {clientIdOf} from '../../core/backend/solana/layout.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../../core/cli/solana-flags.js'
import {PsycheError} from '../../core/errors.js'

interface ClaimSummary {
  run_id: string
  client_id: string
  /** Points paid by this claim, the token base units they paid (a decimal string: a u64, as Solana's RPC spells token
   * amounts), and the client's totals after it. */
  points: number
  amount: string
  earned: number
  claimed: number
  /** The mint paid in and the token account paid. */
  mint: string
  to: string
}

export default class RewardsClaim extends PsycheCommand {
  static summary = "Claim your points on a Solana run: points × the run's token rate, paid from its treasury"
  static description = `Sends the treasurer program's claim, signed by --keypair (a client's key: only its own points can be claimed): the
treasurer reads the points the key earned from the run's coordinator account, and pays those not yet claimed × the
run's token rate (psyche set-rates) from the run's treasury (psyche rewards fund) to --to, a token account of the
treasury's mint (default: the key's associated token account of the mint, created in the same transaction if it does
not exist, its rent paid by the key), by a CPI to the SPL token program. The first claim creates the key's participant record (its rent
paid by the key), which keeps what it claimed: claiming twice pays once (a second claim is refused with NothingToClaim).

--json prints {run_id, client_id, points, amount, earned, claimed, mint, to}; amount (token base units) is a decimal
string, as Solana's RPC spells token amounts (a u64 can exceed what a JSON number holds exactly).`

  static examples = ['<%= config.bin %> rewards claim --program-id <ID> --treasurer-id <TREASURER> --run-id my-run --keypair me.json']

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
    to: Flags.string({summary: "the token account to pay (of the treasury's mint; default: your associated token account, created if need be)"}),
  }

  async run(): Promise<ClaimSummary> {
    const {flags} = await this.parse(RewardsClaim)
    const {chain, signer} = await solanaContext(flags)
    const target = {chain, programId: parseAddress(flags['program-id'], 'program-id'), treasurer: parseAddress(flags['treasurer-id'], 'treasurer-id'), runId: flags['run-id']}
    const treasury = await readTreasury(target)
    if (!treasury) throw new PsycheError(`run ${flags['run-id']} has no treasury: its main authority creates one with psyche rewards fund --mint`, {code: 'ENOTREASURY'})
    const before = (await readClaims(target, [signer.address])).get(signer.address)!
    const to = await claimRewards({...target, client: signer, mint: treasury.treasury.mint, destination: flags.to === undefined ? undefined : parseAddress(flags.to, 'to')})
    const after = (await readClaims(target, [signer.address])).get(signer.address)!
    const id = clientIdOf(signer.address)
    const entry = (await readRunLedger(target)).ledger.entries.find((e) => e.client_id === id)
    const summary = {
      run_id: flags['run-id'],
      client_id: id,
      points: after.claimed - before.claimed,
      amount: String(after.paid - before.paid),
      earned: entry?.earned ?? 0,
      claimed: after.claimed,
      mint: treasury.treasury.mint,
      to,
    }
    if (!this.jsonEnabled()) this.log(`run ${flags['run-id']}: claimed ${summary.points} points, ${summary.amount} token units of ${summary.mint} paid to ${to}`)
    return summary
  }
}
