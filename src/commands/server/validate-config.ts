import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {
  ConfigError,
  checkDataServerForRun,
  formatIssue,
  loadDataServerConfig,
  loadRunConfigFile,
  summarizeRunConfig,
  timingWarnings,
  type ConfigIssue,
  type DataServerConfig,
  type RunSummary,
} from '../../core/config/index.js'
import {checkArchitecture, describeArchitectures} from '../../core/config/architectures.js'
import {checkLocalPaths} from '../../core/data/local-paths.js'
import {demoCorpusDir} from '../../core/corpus.js'
import {PsycheError} from '../../core/errors.js'

/** One problem or warning under --json: the file, the field (dotted path; '' for the whole file), its value, why. */
export interface ConfigProblem {
  file: string
  field: string
  value: string | null
  reason: string
}
const problem = (i: ConfigIssue): ConfigProblem => ({file: i.file, field: i.path, value: i.value ?? null, reason: i.message})

export default class ServerValidateConfig extends PsycheCommand {
  static summary = 'Check a run configuration (state.toml or config.toml) and its data.toml'
  static description = `Loads the file as the coordinator would and prints a short summary of the run, or every problem found (file: field = value: what was expected) and exits non-zero. Every size, count and duration has an upper bound. Local paths are checked as join and server run will use them: a Local data location and the data.toml's dir must hold token data, a Local checkpoint must be a model directory (config.json) of a model_type that model.LLM.architecture runs (${describeArchitectures()}) whose model.safetensors, if any, has a sound header and the tensors config.json describes; --allow-missing reports them as warnings instead, for a config written before its data. What our clients cannot run (an architecture, data location or data option that src/core/config/support.ts marks unsupported, such as a GCS checkpoint) is a problem naming the field, like any other.

--json prints one object: {valid, summary, data, problems, warnings}, where problems and warnings are lists of {file, field, value, reason}; with problems, valid is false, error is {code: "ECONFIG", message} and the exit code is 1.`
  static examples = ['<%= config.bin %> server validate-config --state state.toml', '<%= config.bin %> server validate-config --state state.toml --data-config data.toml --json']

  static flags = {
    state: Flags.string({summary: 'path to the state.toml (or update-config config.toml) to validate', required: true}),
    'data-config': Flags.string({summary: "path to the data server's data.toml to validate with it"}),
    'allow-missing': Flags.boolean({summary: 'report local data and model paths that do not exist yet as warnings (a config written before its data)'}),
  }

  async run(): Promise<{valid: true; summary: RunSummary; data?: Omit<DataServerConfig, 'shuffle_seed'>; problems: ConfigProblem[]; warnings: ConfigProblem[]}> {
    const {flags} = await this.parse(ServerValidateConfig)
    const issues: ConfigIssue[] = []
    const warnings: ConfigIssue[] = []
    const collect = async <T>(load: () => Promise<T>): Promise<T | undefined> => {
      try {
        return await load()
      } catch (error) {
        if (error instanceof ConfigError) {
          issues.push(...error.issues)
          return undefined
        }
        throw error
      }
    }
    const run = await collect(() => loadRunConfigFile(flags.state))
    const data = flags['data-config'] ? await collect(() => loadDataServerConfig(flags['data-config']!)) : undefined
    if (run && data) {
      const cross = checkDataServerForRun(run, data)
      issues.push(...cross.errors)
      warnings.push(...cross.warnings)
    }
    if (run) (flags['allow-missing'] ? warnings : issues).push(...(await checkLocalPaths(run, data, {createdOnUse: [demoCorpusDir]})))
    if (run) warnings.push(...timingWarnings(run))
    if (run) issues.push(...checkArchitecture(run))
    const summary = run ? summarizeRunConfig(run) : undefined
    for (const u of summary?.unsupported ?? []) issues.push({file: flags.state, path: u.path, message: `our clients cannot run this: ${u.reason}`})
    if (issues.length > 0) {
      const count = `${[flags.state, flags['data-config']].filter(Boolean).join(' + ')}: ${issues.length} problem${issues.length > 1 ? 's' : ''} found`
      if (this.jsonEnabled()) {
        // One object on stdout, as on success, with every problem in its own entry; exit code 1.
        this.logJson({valid: false, error: {code: 'ECONFIG', message: count}, problems: issues.map(problem), warnings: warnings.map(problem)})
        this.exit(1)
      }
      // Text: one line per problem, then the one-line error.
      for (const line of issues.map(formatIssue)) process.stderr.write(`${line}\n`)
      for (const line of warnings.map(formatIssue)) process.stderr.write(`warning: ${line}\n`)
      throw new PsycheError(count, {code: 'ECONFIG'})
    }
    const warningLines = warnings.map(formatIssue)
    if (!this.jsonEnabled()) {
      const s = summary!
      const what = s.run_id !== undefined ? `server state of run "${s.run_id}" (${s.run_state ?? 'WaitingForMembers'})` : 'run config (update-config format, no run_id)'
      this.log(`${flags.state}: valid ${what}`)
      this.log(`  model      ${s.architecture}, max_seq_len ${s.max_seq_len}, checkpoint ${s.checkpoint}`)
      this.log(`  data       ${s.data_location}`)
      const steps = s.inner_steps > 1 ? `${s.total_steps} rounds of ${s.inner_steps} inner steps` : `${s.total_steps} steps`
      this.log(`  training   ${steps}, global batch ${s.global_batch_size}, ≤ ${s.total_tokens.toLocaleString('en-US')} tokens`)
      this.log(`  optimizer  ${s.optimizer}; lr ${s.lr_schedule}`)
      this.log(`  clients    min ${s.min_clients}, ${s.init_min_clients} to start an epoch, witnesses ${s.witness_nodes}`)
      const g = s.max_trainers_per_round
      if (g !== null) {
        // The trade: fewer trainers a round means more batches each (compute per round), fewer results to download (bandwidth per client).
        const batch = run!.config!.global_batch_size_end
        this.log(
          `  trainers   at most ${g} a round (max_trainers_per_round): each client downloads at most ${g} results a round, each trainer computes ≥ ${Math.floor(batch / g)} of the ${batch} samples`,
        )
      } else this.log("  trainers   every member, every round: each client downloads every other member's result a round")
      if (data) this.log(`  data.toml  ${data.dir}, ${data.token_size}, seq_len ${data.seq_len}`)
      for (const u of s.solana_unsupported) this.log(`  solana     not on the Solana program: ${u.path}: ${u.reason}`)
      for (const line of warningLines) process.stderr.write(`warning: ${line}\n`)
    }
    const {shuffle_seed: _seed, ...dataInfo} = data ?? ({} as DataServerConfig)
    return {valid: true, summary: summary!, ...(data ? {data: dataInfo} : {}), problems: [], warnings: warnings.map(problem)}
  }
}
