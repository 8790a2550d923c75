import {Args, Flags} from '@oclif/core'
import {readRun, setPaused} from '../core/backend/solana/admin.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../core/cli/solana-flags.js'

export default class SetPaused extends PsycheCommand {
  static summary = 'Pause or resume a Solana run (main authority only)'
  static description = 'pause: an epoch under way finishes first (its Cooldown ends in Paused). resume: a paused (or new, configured) run waits for members again.'
  static examples = ['<%= config.bin %> set-paused --program-id <ID> --run-id my-run resume']

  static args = {
    action: Args.string({description: 'resume or pause', required: true, options: ['resume', 'pause']}),
  }

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
  }

  async run(): Promise<{run_id: string; run_state: string; pending_pause: boolean}> {
    const {args, flags} = await this.parse(SetPaused)
    const {chain, signer} = await solanaContext(flags)
    const target = {chain, programId: parseAddress(flags['program-id'], 'program-id'), runId: flags['run-id']}
    await setPaused({...target, authority: signer, paused: args.action === 'pause'})
    const {state} = await readRun(target)
    if (!this.jsonEnabled()) this.log(`run ${flags['run-id']}: ${state.run_state}${state.pending_pause ? ' (pauses at the end of this epoch)' : ''}`)
    return {run_id: flags['run-id'], run_state: state.run_state, pending_pause: state.pending_pause}
  }
}
