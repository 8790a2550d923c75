import {Flags} from '@oclif/core'
import {grant} from '../../core/backend/solana/admin.js'
import {ANYONE} from '../../core/backend/solana/authorizer.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../../core/cli/solana-flags.js'

export default class AuthorizeGrant extends PsycheCommand {
  static summary = 'Grant a key permission to join the runs whose join authority is --keypair'
  static examples = ['<%= config.bin %> authorize grant --authorizer-id <AUTH> --keypair join-authority.json --grantee <KEY>']

  static flags = {
    ...solanaFlags,
    grantee: Flags.string({summary: 'the key granted (it may name delegates); "anyone" admits every key', required: true}),
  }

  async run(): Promise<{authorization: string; grantor: string; grantee: string}> {
    const {flags} = await this.parse(AuthorizeGrant)
    const {chain, signer} = await solanaContext(flags)
    const grantee = flags.grantee === 'anyone' ? ANYONE : parseAddress(flags.grantee, 'grantee')
    const authorization = await grant({chain, authorizer: parseAddress(flags['authorizer-id'], 'authorizer-id'), grantor: signer, grantee})
    if (!this.jsonEnabled()) this.log(`authorization ${authorization}: ${signer.address} → ${flags.grantee}`)
    return {authorization, grantor: signer.address, grantee}
  }
}
