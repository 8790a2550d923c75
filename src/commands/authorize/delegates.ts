import {Flags} from '@oclif/core'
import {setDelegates} from '../../core/backend/solana/admin.js'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../../core/cli/solana-flags.js'

export default class AuthorizeDelegates extends PsycheCommand {
  static summary = 'As a grantee (--keypair), set the keys that may join on your authorization (replaces the list)'
  static examples = ['<%= config.bin %> authorize delegates --authorizer-id <AUTH> --keypair me.json --grantor <JOIN_AUTHORITY> --delegate <HOT_KEY_1> --delegate <HOT_KEY_2>']

  static flags = {
    ...solanaFlags,
    grantor: Flags.string({summary: "the key that granted the authorization (the run's join authority)", required: true}),
    delegate: Flags.string({summary: 'a key that may join for you (repeat; none clears the list)', multiple: true, default: []}),
  }

  async run(): Promise<{authorization: string; delegates: string[]}> {
    const {flags} = await this.parse(AuthorizeDelegates)
    const {chain, signer} = await solanaContext(flags)
    const delegates = flags.delegate.map((d) => parseAddress(d, 'delegate'))
    const authorization = await setDelegates({
      chain,
      authorizer: parseAddress(flags['authorizer-id'], 'authorizer-id'),
      grantee: signer,
      grantor: parseAddress(flags.grantor, 'grantor'),
      delegates,
    })
    if (!this.jsonEnabled()) this.log(`authorization ${authorization}: ${delegates.length} delegate(s)`)
    return {authorization, delegates}
  }
}
