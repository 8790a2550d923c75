import {Flags} from '@oclif/core'
import {revoke} from '../../core/backend/solana/admin.js'
import {ANYONE} from '../../core/backend/solana/authorizer.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../../core/cli/solana-flags.js'

export default class AuthorizeRevoke extends PsycheCommand {
  static summary = 'Revoke an authorization you (--keypair) granted; its rent returns to you'
  static examples = ['<%= config.bin %> authorize revoke --authorizer-id <AUTH> --keypair join-authority.json --grantee <KEY>']

  static flags = {
    ...solanaFlags,
    grantee: Flags.string({summary: 'the key whose authorization is revoked ("anyone" for an open grant)', required: true}),
  }

  async run(): Promise<{authorization: string; revoked: boolean}> {
    const {flags} = await this.parse(AuthorizeRevoke)
    const {chain, signer} = await solanaContext(flags)
    const grantee = flags.grantee === 'anyone' ? ANYONE : parseAddress(flags.grantee, 'grantee')
    const authorization = await revoke({chain, authorizer: parseAddress(flags['authorizer-id'], 'authorizer-id'), grantor: signer, grantee})
    if (!this.jsonEnabled()) this.log(`revoked authorization ${authorization}`)
    return {authorization, revoked: true}
  }
}
