import {Args, Flags} from '@oclif/core'
import {existsSync} from 'node:fs'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {PsycheError} from '../../core/errors.js'
import {generateIdentity, saveIdentity} from '../../core/protocol/index.js'

export default class IdentityNew extends PsycheCommand {
  static summary = "Create a new ed25519 identity (a client's or a server's) and print its id"
  static description = `Writes a random ed25519 key to FILE (JSON, mode 0600: {"type":"psyche-identity","version":1,"algorithm":"ed25519","id":...,"secret_seed":...}). The id — the hex public key — is what the coordinator calls the client, and what clients pin a server by. Refuses to overwrite an existing file without --force.`
  static examples = ['<%= config.bin %> identity new client.json', '<%= config.bin %> identity new --out server.json --json']

  static args = {
    file: Args.string({description: 'file to write the identity to; or --out'}),
  }

  static flags = {
    out: Flags.string({summary: 'file to write the identity to (the same as FILE)'}),
    force: Flags.boolean({summary: 'overwrite FILE if it exists (its old identity is lost)'}),
  }

  async run(): Promise<{id: string; path: string}> {
    const {args, flags} = await this.parse(IdentityNew)
    if (args.file && flags.out && args.file !== flags.out) this.error(`two files given (${args.file} and --out ${flags.out}): give one`, {exit: 2})
    const out = args.file ?? flags.out
    if (!out) this.error('give the file to write: psyche identity new FILE', {exit: 2})
    if (existsSync(out) && !flags.force) throw new PsycheError(`${out} already exists (an identity is not replaceable: use --force to overwrite it)`, {code: 'EEXIST'})
    const identity = generateIdentity()
    await saveIdentity(identity, out)
    if (!this.jsonEnabled()) this.log(identity.id)
    return {id: identity.id, path: out}
  }
}
