import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {loadIdentity} from '../../core/protocol/index.js'

export default class IdentityShow extends PsycheCommand {
  static summary = 'Print the id (hex ed25519 public key) of an identity file'
  static examples = ['<%= config.bin %> identity show --identity client.json']

  static flags = {
    identity: Flags.string({summary: 'the identity file (psyche identity new)', required: true}),
  }

  async run(): Promise<{id: string; path: string}> {
    const {flags} = await this.parse(IdentityShow)
    const identity = await loadIdentity(flags.identity)
    if (!this.jsonEnabled()) this.log(identity.id)
    return {id: identity.id, path: flags.identity}
  }
}
