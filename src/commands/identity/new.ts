import {Args, Flags} from '@oclif/core'
import {existsSync} from 'node:fs'
import {addressOfClient} from '../../core/backend/solana/layout.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {PsycheError} from '../../core/errors.js'
import {generateIdentity, identityPrivateSeed, saveIdentity, writeFileAtomicSync} from '../../core/protocol/index.js'

export default class IdentityNew extends PsycheCommand {
  static summary = "Create a new ed25519 identity (a client's or a server's) and print its id"
  static description = `Writes a random ed25519 key to FILE (JSON, mode 0600: {"type":"psyche-identity","version":1,"algorithm":"ed25519","id":...,"secret_seed":...}). The id — the hex public key — is what the coordinator calls the client, and what clients pin a server by. Refuses to overwrite an existing file without --force.

With --solana the file is a Solana CLI keypair instead (a JSON array of the 64 bytes seed ‖ public key, as solana-keygen writes it), for --keypair of the Solana commands and psyche join --rpc; it prints the id and, on a second line, the base58 Solana address of the same key.`
  static examples = ['<%= config.bin %> identity new client.json', '<%= config.bin %> identity new --out server.json --json', '<%= config.bin %> identity new --solana me.json']

  static args = {
    file: Args.string({description: 'file to write the identity to; or --out'}),
  }

  static flags = {
    out: Flags.string({summary: 'file to write the identity to (the same as FILE)'}),
    force: Flags.boolean({summary: 'overwrite FILE if it exists (its old identity is lost)'}),
    solana: Flags.boolean({summary: 'write a Solana CLI keypair file (JSON array of 64 bytes) instead of a psyche identity'}),
  }

  async run(): Promise<{id: string; address: string; path: string; format: 'psyche-identity' | 'solana-keypair'}> {
    const {args, flags} = await this.parse(IdentityNew)
    if (args.file && flags.out && args.file !== flags.out) this.error(`two files given (${args.file} and --out ${flags.out}): give one`, {exit: 2})
    const out = args.file ?? flags.out
    if (!out) this.error('give the file to write: psyche identity new FILE', {exit: 2})
    if (existsSync(out) && !flags.force) throw new PsycheError(`${out} already exists (an identity is not replaceable: use --force to overwrite it)`, {code: 'EEXIST'})
    const identity = generateIdentity()
    const address = addressOfClient(identity.id)
    if (flags.solana) {
      const bytes = [...identityPrivateSeed(identity), ...identity.publicKey]
      try {
        writeFileAtomicSync(out, `${JSON.stringify(bytes)}\n`, 0o600)
      } catch (error) {
        throw new PsycheError(`${out}: cannot write the keypair: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`, {cause: error})
      }
      if (!this.jsonEnabled()) this.log(`${identity.id}\n${address}`)
    } else {
      await saveIdentity(identity, out)
      if (!this.jsonEnabled()) this.log(identity.id)
    }
    return {id: identity.id, address, path: out, format: flags.solana ? 'solana-keypair' : 'psyche-identity'}
  }
}
