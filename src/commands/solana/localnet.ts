import {readFileSync} from 'node:fs'
import {Flags} from '@oclif/core'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH} from '../../core/backend/solana/local-chain.js'
import {Localnet} from '../../core/backend/solana/localnet.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress} from '../../core/cli/solana-flags.js'

export default class SolanaLocalnet extends PsycheCommand {
  static summary = "Serve a one-machine Solana cluster (LiteSVM) with psyche's programs, on the standard JSON-RPC API"
  static description = `For trying Solana runs without a validator: the committed coordinator and authorizer programs run in the real Solana runtime (LiteSVM), with a clock that follows wall time, behind the JSON-RPC methods psyche's commands use and accountSubscribe on a websocket at the same address. --fund airdrops 100 SOL to an address. Not a validator: no consensus, state lost on exit. For a real cluster use solana-test-validator or devnet (README).

--json prints {"event":"listening","url":...} on stdout when ready.`
  static examples = ['<%= config.bin %> solana localnet --program-id <ID> --authorizer-id <AUTH> --fund <MY_ADDRESS>']

  static flags = {
    'program-id': Flags.string({summary: 'address to deploy the coordinator program at', required: true}),
    'authorizer-id': Flags.string({summary: 'address to deploy the authorizer program at', required: true}),
    port: Flags.integer({summary: 'TCP port (0: any free port)', default: 8899, min: 0, max: 65535}),
    host: Flags.string({summary: 'address to listen on', default: '127.0.0.1'}),
    fund: Flags.string({summary: 'airdrop 100 SOL to this address (repeat)', multiple: true, default: []}),
  }

  async run(): Promise<void> {
    const {flags} = await this.parse(SolanaLocalnet)
    const net = new Localnet({
      host: flags.host,
      port: flags.port,
      programs: [
        {address: parseAddress(flags['program-id'], 'program-id'), bytes: readFileSync(COORDINATOR_PROGRAM_PATH)},
        {address: parseAddress(flags['authorizer-id'], 'authorizer-id'), bytes: readFileSync(AUTHORIZER_PROGRAM_PATH)},
      ],
    })
    for (const a of flags.fund) net.chain.airdrop(parseAddress(a, 'fund'))
    const url = await net.start()
    if (this.jsonEnabled()) process.stdout.write(`${JSON.stringify({event: 'listening', url})}\n`)
    else this.log(`localnet listening on ${url} (coordinator ${flags['program-id']}, authorizer ${flags['authorizer-id']})`)
    await this.shutdown.requested()
    await net.close()
  }
}
