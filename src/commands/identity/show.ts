import {Args, Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {loadIdentity} from '../../core/protocol/index.js'

export default class IdentityShow extends PsycheCommand {
  static summary = 'Print the id (hex ed25519 public key) of an identity file'
  static examples = ['<%= config.bin %> identity show client.json', '<%= config.bin %> identity show --identity client.json --json']

  static args = {
    file: Args.string({description: 'the identity file (psyche identity new); or --identity'}),
  }

  static flags = {
    identity: Flags.string({summary: 'the identity file (the same as FILE)'}),
  }

  async run(): Promise<{id: string; path: string}> {
    const {args, flags} = await this.parse(IdentityShow)
    if (args.file && flags.identity && args.file !== flags.identity) this.error(`two identity files given (${args.file} and --identity ${flags.identity}): give one`, {exit: 2})
    const file = args.file ?? flags.identity
    if (!file) this.error('give the identity file: psyche identity show FILE', {exit: 2})
    const identity = await loadIdentity(file)
    if (!this.jsonEnabled()) this.log(identity.id)
    return {id: identity.id, path: file}
  }
}
