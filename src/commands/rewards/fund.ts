import {Flags} from '@oclif/core'
import {fundTreasury, readTreasury} from '../../core/backend/solana/admin.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../../core/cli/solana-flags.js'
import {PsycheError} from '../../core/errors.js'

interface FundSummary {
  run_id: string
  /** The treasury (treasurer program address), its token account, and its mint. */
  treasury: string
  vault: string
  mint: string
  /** Whether this command created the treasury. */
  created: boolean
  /** Token base units (decimal strings): this command paid in; all that fund paid in; what the vault holds now; what claims paid out. */
  amount: string
  funded: string
  balance: string
  paid: string
}

export default class RewardsFund extends PsycheCommand {
  static summary = "Create and fund a Solana run's treasury, from which clients claim their points (main authority only)"
  static description = `The run's main authority (--keypair) creates the run's treasury in the treasurer program the first time, for the
SPL token --mint (a run has one treasury, of one mint): a program address of the treasurer that owns, as its token
owner, a token account of the mint (the vault). Then --amount token base units move from --from (a token account of
the mint whose owner is --keypair; default: its associated token account) into the vault, by a CPI to the SPL token
program. Clients claim from it with psyche
rewards claim: their points × the run's token rate (psyche set-rates). Only the run's main authority creates or funds
it (anyone else is refused: Unauthorized); tokens sent to the vault with an ordinary transfer are a gift and pay
claims too. Without --amount, it only creates the treasury.

--json prints {run_id, treasury, vault, mint, created, amount, funded, balance, paid}; the token amounts are decimal
strings, as Solana's RPC spells them (a u64 can exceed what a JSON number holds exactly).`

  static examples = [
    '<%= config.bin %> rewards fund --program-id <ID> --treasurer-id <TREASURER> --run-id my-run --keypair authority.json --mint <MINT> --from <TOKEN ACCOUNT> --amount 1000000',
    '<%= config.bin %> rewards fund --run-id my-run --keypair authority.json --amount 500000',
  ]

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
    mint: Flags.string({summary: "the SPL token mint claims pay in (needed to create the run's treasury)"}),
    from: Flags.string({summary: 'your token account of the mint that pays in (default: your associated token account)'}),
    amount: Flags.string({summary: 'token base units to move into the treasury (an integer up to 2^64 − 1)', default: '0'}),
  }

  async run(): Promise<FundSummary> {
    const {flags} = await this.parse(RewardsFund)
    const {chain, signer} = await solanaContext(flags)
    const target = {chain, programId: parseAddress(flags['program-id'], 'program-id'), treasurer: parseAddress(flags['treasurer-id'], 'treasurer-id'), runId: flags['run-id']}
    const amount = tokenAmount(flags.amount)
    const {created} = await fundTreasury({
      ...target,
      authority: signer,
      mint: flags.mint ? parseAddress(flags.mint, 'mint') : undefined,
      source: flags.from ? parseAddress(flags.from, 'from') : undefined,
      amount,
    })
    const now = (await readTreasury(target))!
    const summary = {
      run_id: flags['run-id'],
      treasury: now.address,
      vault: now.treasury.vault,
      mint: now.treasury.mint,
      created,
      amount: String(amount),
      funded: String(now.treasury.funded),
      balance: String(now.balance),
      paid: String(now.treasury.paid),
    }
    if (!this.jsonEnabled())
      this.log(
        `run ${flags['run-id']}: ${created ? 'created its treasury ' : 'treasury '}${now.address} (mint ${summary.mint}, vault ${summary.vault})` +
          `${amount ? `; paid in ${amount}` : ''}; it holds ${summary.balance} token units (${summary.paid} paid out to claims)`,
      )
    return summary
  }
}

/** --amount: token base units, a u64 in decimal. */
function tokenAmount(text: string): bigint {
  if (!/^[0-9]{1,20}$/.test(text) || BigInt(text) >= 1n << 64n)
    throw new PsycheError(`--amount ${JSON.stringify(text)}: token base units, an integer from 0 to 2^64 − 1`, {code: 'EUSAGE'})
  return BigInt(text)
}
