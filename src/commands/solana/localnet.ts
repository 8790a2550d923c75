import {existsSync, readFileSync} from 'node:fs'
import {randomBytes} from 'node:crypto'
import {Flags} from '@oclif/core'
import {generateKeyPairSigner, getAddressDecoder, isAddress, type Address} from '@solana/kit'
import {loadKeypair} from '../../core/backend/solana/admin.js'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH, TREASURER_PROGRAM_PATH, programPath, type ChainFeatures} from '../../core/backend/solana/local-chain.js'
import {Localnet} from '../../core/backend/solana/localnet.js'
import {createTestMint} from '../../core/backend/solana/spl.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress} from '../../core/cli/solana-flags.js'

export default class SolanaLocalnet extends PsycheCommand {
  static summary = "Serve a one-machine Solana cluster (LiteSVM) with psyche's programs, on the standard JSON-RPC API"
  static description = `For trying Solana runs without a validator or the Solana CLI: the committed coordinator, authorizer and treasurer programs run in the real Solana runtime (LiteSVM, with the SPL token programs), with a clock and slots that follow wall time, behind the JSON-RPC methods psyche's commands use, and accountSubscribe/signatureSubscribe on a websocket at the same address. Like a cluster it refuses transactions over 1,232 bytes and expired blockhashes, and enforces the compute limit a transaction asks for. Without --program-id / --authorizer-id / --treasurer-id it deploys at new random addresses. It prints the export lines that point psyche's commands at it (PSYCHE_COORDINATOR_PROGRAM, PSYCHE_AUTHORIZER_PROGRAM, PSYCHE_TREASURER_PROGRAM, PSYCHE_SOLANA_RPC, PSYCHE_SOLANA_WS_RPC). --fund airdrops 100 SOL to an address or a keypair file's; with --tokens N, the localnet also creates a token mint (PSYCHE_TOKEN_MINT, printed) and gives each --fund address N of it in its associated token account, for trying token rewards (psyche rewards fund, psyche rewards claim) without the spl-token CLI. Not a validator: no consensus, state lost on exit. For a real cluster use solana-test-validator or devnet (README).

--json prints {"event":"listening","url":...,"ws_url":...,"program_id":...,"authorizer_id":...,"treasurer_id":...,"token_mint":... (null without --tokens)} on stdout when ready.`
  static examples = [
    '<%= config.bin %> solana localnet --fund me.json',
    '<%= config.bin %> solana localnet --fund me.json --fund client.json --tokens 1000000',
    '<%= config.bin %> solana localnet --program-id <ID> --authorizer-id <AUTH> --fund <MY_ADDRESS>',
  ]

  static flags = {
    'program-id': Flags.string({summary: 'address to deploy the coordinator program at (default: a new random one)'}),
    'authorizer-id': Flags.string({summary: 'address to deploy the authorizer program at (default: a new random one)'}),
    'treasurer-id': Flags.string({summary: 'address to deploy the treasurer program at (default: a new random one)'}),
    port: Flags.integer({summary: 'TCP port (0: any free port)', default: 8899, min: 0, max: 65535}),
    host: Flags.string({summary: 'address to listen on', default: '127.0.0.1'}),
    fund: Flags.string({summary: "airdrop 100 SOL to this address, or to a keypair file's (repeat)", multiple: true, default: []}),
    tokens: Flags.integer({summary: 'create a token mint and give each --fund address this many base units of it', min: 1}),
    features: Flags.string({
      summary: "the cluster's feature set: current (every feature, SIMD-0500 included: sBPF v3 programs) or legacy (without SIMD-0500: the sBPF v0 builds)",
      options: ['current', 'legacy'],
      default: 'current',
    }),
  }

  async run(): Promise<void> {
    const {flags} = await this.parse(SolanaLocalnet)
    const programId = flags['program-id'] ? parseAddress(flags['program-id'], 'program-id') : randomAddress()
    const authorizerId = flags['authorizer-id'] ? parseAddress(flags['authorizer-id'], 'authorizer-id') : randomAddress()
    const treasurerId = flags['treasurer-id'] ? parseAddress(flags['treasurer-id'], 'treasurer-id') : randomAddress()
    const features = flags.features as ChainFeatures
    const net = new Localnet({
      host: flags.host,
      port: flags.port,
      features,
      programs: [
        {address: programId, bytes: readFileSync(programPath(COORDINATOR_PROGRAM_PATH, features))},
        {address: authorizerId, bytes: readFileSync(programPath(AUTHORIZER_PROGRAM_PATH, features))},
        {address: treasurerId, bytes: readFileSync(programPath(TREASURER_PROGRAM_PATH, features))},
      ],
    })
    const funded: Address[] = []
    for (const a of flags.fund) funded.push(isAddress(a) || !existsSync(a) ? parseAddress(a, 'fund') : (await loadKeypair(a)).address)
    for (const a of funded) net.chain.airdrop(a)
    const url = await net.start()
    let mint: Address | null = null
    if (flags.tokens) {
      const authority = await generateKeyPairSigner()
      net.chain.airdrop(authority.address)
      mint = await createTestMint(net.chain, authority, funded, BigInt(flags.tokens))
    }
    if (this.jsonEnabled())
      process.stdout.write(
        `${JSON.stringify({event: 'listening', url, ws_url: net.wsUrl, program_id: programId, authorizer_id: authorizerId, treasurer_id: treasurerId, token_mint: mint})}\n`,
      )
    else {
      this.log(`# localnet listening on ${url} (coordinator ${programId}, authorizer ${authorizerId}, treasurer ${treasurerId}); in another shell:`)
      this.log(`export PSYCHE_COORDINATOR_PROGRAM=${programId}`)
      this.log(`export PSYCHE_AUTHORIZER_PROGRAM=${authorizerId}`)
      this.log(`export PSYCHE_TREASURER_PROGRAM=${treasurerId}`)
      if (mint) {
        this.log(`# a token mint, ${flags.tokens} of it in each funded address's associated token account (psyche rewards fund --mint):`)
        this.log(`export PSYCHE_TOKEN_MINT=${mint}`)
      }
      this.log(`export PSYCHE_SOLANA_RPC=${url}`)
      this.log(`export PSYCHE_SOLANA_WS_RPC=${net.wsUrl}`)
    }
    await this.shutdown.requested()
    await net.close()
  }
}

/** A program id nobody holds the key of (a localnet deploys without one). */
function randomAddress(): Address {
  return getAddressDecoder().decode(randomBytes(32))
}
