import {Flags} from '@oclif/core'
import {updateConfig} from '../core/backend/solana/admin.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../core/cli/solana-flags.js'
import {loadRunConfigFile} from '../core/config/index.js'

export default class UpdateConfig extends PsycheCommand {
  static summary = "Set a Solana run's configuration and model from a run configuration file (main authority only, while paused)"
  static examples = ['<%= config.bin %> update-config --program-id <ID> --run-id my-run --config-path state.toml']

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id', required: true}),
    'config-path': Flags.string({summary: 'the state.toml / config.toml with [config] and [model.LLM]', required: true}),
  }

  async run(): Promise<{run_id: string; config_path: string}> {
    const {flags} = await this.parse(UpdateConfig)
    const {chain, signer} = await solanaContext(flags)
    const file = await loadRunConfigFile(flags['config-path'])
    await updateConfig({chain, programId: parseAddress(flags['program-id'], 'program-id'), runId: flags['run-id'], authority: signer, file})
    if (!this.jsonEnabled()) this.log(`run ${flags['run-id']}: configuration set from ${flags['config-path']}`)
    return {run_id: flags['run-id'], config_path: flags['config-path']}
  }
}
