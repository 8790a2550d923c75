import {readFileSync} from 'node:fs'
import {Args, Flags} from '@oclif/core'
import {loadKeypairWithSeed} from '../../core/backend/solana/admin.js'
import {addressOfClient} from '../../core/backend/solana/layout.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {identityFromSeed, loadIdentity, type Identity} from '../../core/protocol/index.js'

export default class IdentityShow extends PsycheCommand {
  static summary = 'Print the id (hex ed25519 public key) of an identity file, and its base58 Solana address'
  static description = `FILE is a psyche identity (psyche identity new) or a Solana CLI keypair file (psyche identity new --solana, solana-keygen): the same ed25519 key is a client's id, its libp2p peer id and its Solana address. Prints the id, then the address on a second line (--address: the address only, for scripts).`
  static examples = [
    '<%= config.bin %> identity show client.json',
    '<%= config.bin %> identity show --identity client.json --json',
    '<%= config.bin %> identity show me.json --address',
  ]

  static args = {
    file: Args.string({description: 'the identity or Solana keypair file; or --identity'}),
  }

  static flags = {
    identity: Flags.string({summary: 'the identity or Solana keypair file (the same as FILE)'}),
    address: Flags.boolean({summary: 'print only the base58 Solana address'}),
  }

  async run(): Promise<{id: string; address: string; path: string}> {
    const {args, flags} = await this.parse(IdentityShow)
    if (args.file && flags.identity && args.file !== flags.identity) this.error(`two identity files given (${args.file} and --identity ${flags.identity}): give one`, {exit: 2})
    const file = args.file ?? flags.identity
    if (!file) this.error('give the identity file: psyche identity show FILE', {exit: 2})
    const identity = await load(file)
    const address = addressOfClient(identity.id)
    if (!this.jsonEnabled()) this.log(flags.address ? address : `${identity.id}\n${address}`)
    return {id: identity.id, address, path: file}
  }
}

/** A psyche identity file, or a Solana keypair file (a JSON array) as the same key. */
async function load(path: string): Promise<Identity> {
  let array = false
  try {
    array = readFileSync(path, 'utf8').trimStart().startsWith('[')
  } catch {
    // loadIdentity names the file and why it cannot be read
  }
  return array ? identityFromSeed((await loadKeypairWithSeed(path)).seed) : loadIdentity(path)
}
