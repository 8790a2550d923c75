import {Flags} from '@oclif/core'
import {createRun, prepareUpdate, readRun, sendUpdate, setMetadata} from '../core/backend/solana/admin.js'
import {coordinatorAddress} from '../core/backend/solana/instructions.js'
import {RUN_ID_MAX} from '../core/backend/solana/layout.js'
import {encodeSetMetadata} from '../core/backend/solana/layout.js'
import {PsycheError} from '../core/errors.js'
import {PsycheCommand} from '../core/cli/base-command.js'
import {parseAddress, solanaContext, solanaFlags} from '../core/cli/solana-flags.js'
import {loadRunConfigFile} from '../core/config/index.js'

export default class CreateRun extends PsycheCommand {
  static summary = 'Create a run on Solana: its coordinator account, owned by the coordinator program'
  static description = `Sends init_coordinator for --run-id: the account is the program address of ("coordinator", run id), funded by --keypair, whose key becomes the run's main authority. With --join-authority the run is permissioned (clients need an authorization from that key: psyche authorize grant); without, anyone may join. With --config-path the configuration is set too (as update-config); --name and --description are kept on chain in the run's metadata record (the main authority's, beside the coordinator). The run starts paused: resume it with psyche set-paused --run-id ID resume.

Everything is checked before anything is sent (the run id's length, the configuration, the name and description; a configuration too large for one transaction goes through the run's update buffer, in chunks). Should a later step fail (the network, the payer's balance), running the same command again finishes the run: a run that exists, is still Uninitialized and is the signer's gets its name, description and configuration; any other existing run is refused with a message to use update-config.`
  static examples = [
    '<%= config.bin %> create-run --rpc http://127.0.0.1:8899 --program-id <ID> --run-id my-run --config-path state.toml',
    '<%= config.bin %> create-run --program-id <ID> --authorizer-id <AUTH> --run-id closed-run --join-authority <KEY>',
  ]

  static flags = {
    ...solanaFlags,
    'run-id': Flags.string({summary: 'the run id (1 to 32 bytes)', required: true}),
    'join-authority': Flags.string({summary: 'make the run permissioned: clients need an authorization granted by this key'}),
    'config-path': Flags.string({summary: 'also set the configuration from this state.toml / config.toml'}),
    name: Flags.string({summary: "the run's name (at most 64 bytes), kept on chain beside its coordinator"}),
    description: Flags.string({summary: "the run's description (at most 512 bytes)"}),
  }

  async run(): Promise<{
    run_id: string
    coordinator: string
    main_authority: string
    join_authority: string | null
    configured: boolean
    name: string | null
    description: string | null
  }> {
    const {flags} = await this.parse(CreateRun)
    const {chain, signer} = await solanaContext(flags)
    const programId = parseAddress(flags['program-id'], 'program-id')
    const joinAuthority = flags['join-authority'] ? parseAddress(flags['join-authority'], 'join-authority') : null
    const authorizer = joinAuthority ? parseAddress(flags['authorizer-id'], 'authorizer-id') : null
    const file = flags['config-path'] ? await loadRunConfigFile(flags['config-path']) : undefined
    const target = {chain, programId, runId: flags['run-id']}
    const metadata = flags.name !== undefined || flags.description !== undefined ? {name: flags.name ?? '', description: flags.description ?? ''} : undefined
    if (metadata) {
      // refused before anything is created
      try {
        encodeSetMetadata(metadata, 0n)
      } catch (error) {
        throw new PsycheError(`--name/--description: ${(error as Error).message}`, {code: 'EUSAGE'})
      }
    }
    if (Buffer.byteLength(flags['run-id'], 'utf8') < 1 || Buffer.byteLength(flags['run-id'], 'utf8') > RUN_ID_MAX)
      throw new PsycheError(`--run-id ${JSON.stringify(flags['run-id'])}: a run id on Solana is 1 to ${RUN_ID_MAX} bytes (a program address seed)`, {code: 'EUSAGE'})
    const update = file ? await prepareUpdate({...target, authority: signer, file}) : undefined
    let coordinator = await coordinatorAddress(programId, flags['run-id'])
    const existing = await chain.fetchAccount(coordinator).then((data) => (data ? readRun(target) : undefined))
    if (existing) {
      // a half-made run (created, then the metadata or the configuration failed) is finished; any other is left alone
      const unchanged = existing.main_authority === signer.address && existing.join_authority === joinAuthority && existing.state.run_state === 'Uninitialized'
      if (!unchanged)
        throw new PsycheError(
          `run ${flags['run-id']} already exists (coordinator ${coordinator}, ${existing.state.run_state}, main authority ${existing.main_authority}): change its configuration with psyche update-config, or pick another --run-id`,
          {code: 'EEXIST'},
        )
      if (!this.jsonEnabled()) this.log(`run ${flags['run-id']} exists and is not configured yet: finishing it`)
    } else coordinator = await createRun({...target, payer: signer, mainAuthority: signer.address, joinAuthority, authorizer})
    if (metadata) await setMetadata({...target, authority: signer, metadata})
    if (update) {
      const r = await sendUpdate(chain, signer, update)
      if (!r.ok) {
        const why = r.logs.filter((l) => l.startsWith('Program log: ')).map((l) => l.slice('Program log: '.length))
        throw new PsycheError(
          `create-run ${flags['run-id']}: the run was created but its configuration was refused: ${r.error}${why.length ? ` (${why.join('; ')})` : ''}; fix the file and run this command again`,
          {code: 'EREFUSED'},
        )
      }
    }
    if (!this.jsonEnabled())
      this.log(`created run ${flags['run-id']}: coordinator ${coordinator}${file ? ', configured' : ''} (paused; resume with psyche set-paused --run-id ${flags['run-id']} resume)`)
    return {
      run_id: flags['run-id'],
      coordinator,
      main_authority: signer.address,
      join_authority: joinAuthority,
      configured: Boolean(file),
      name: metadata?.name ?? null,
      description: metadata?.description ?? null,
    }
  }
}
