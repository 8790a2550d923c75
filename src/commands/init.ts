import {Args, Flags} from '@oclif/core'
import {relative} from 'node:path'

/** A path as the user best reads it: relative to the working directory unless that climbs out of it. */
function shown(path: string): string {
  const rel = relative(process.cwd(), path)
  return rel === '' ? '.' : rel.startsWith('..') ? path : rel
}
import {PsycheCommand} from '../core/cli/base-command.js'
import {scaffoldRun, type ScaffoldResult} from '../core/config/scaffold.js'

export default class Init extends PsycheCommand {
  static summary = "Create a run directory from a template: state.toml, the model's config.json, and data.toml where the template has one"
  static description = `Copies templates/NAME into DIR, rewriting relative paths that point outside the template so they still work from DIR. It copies the model's config.json but creates no weights: run the printed \`psyche model init\` next.`
  static examples = [
    '<%= config.bin %> init my-run',
    '<%= config.bin %> init runs/a --template tiny-demo --run-id a',
    '<%= config.bin %> init my-run --min-clients 2',
    '<%= config.bin %> init my-run --json',
  ]

  static args = {
    dir: Args.string({description: 'directory to create (default: ./TEMPLATE)'}),
  }

  static flags = {
    template: Flags.string({summary: 'run template (a folder of templates/ with a state.toml)', default: 'tiny-demo'}),
    'run-id': Flags.string({summary: "run id to write into state.toml (default: the template's)"}),
    'min-clients': Flags.integer({
      summary: "clients every epoch waits for before it starts (init_min_clients; default: the template's)",
      description:
        "Start each epoch only once this many clients have joined (the first epoch and every later one, as Psyche's coordinator does), so that none trains alone. min_clients (the clients a started epoch needs to go on) is lowered to it if the template has more.",
      min: 1,
    }),
    force: Flags.boolean({summary: 'write into a non-empty directory, replacing files of the same name'}),
  }

  async run(): Promise<ScaffoldResult & {next_steps: string[]}> {
    const {args, flags} = await this.parse(Init)
    const result = await scaffoldRun({template: flags.template, dir: args.dir ?? flags.template, runId: flags['run-id'], force: flags.force, minClients: flags['min-clients']})
    const dir = shown(result.dir)
    const next: string[] = []
    if (result.model_dir && !result.model_has_weights) {
      next.push(`psyche model init --template ${flags.template} --out ${shown(result.model_dir)}`)
    }
    next.push(`psyche server validate-config --state ${dir}/state.toml${result.files.includes('data.toml') ? ` --data-config ${dir}/data.toml` : ''}`)
    next.push(`psyche server run --state ${dir}/state.toml`)
    if (!this.jsonEnabled()) {
      this.log(`created ${dir} from template ${flags.template} (run ${result.run_id ?? '(no run_id)'}): ${result.files.join(', ')}`)
      for (const r of result.rewritten) this.log(`  ${r.file}: ${r.from} → ${r.to}`)
      this.log('next:')
      for (const step of next) this.log(`  ${step}`)
    }
    return {...result, next_steps: next}
  }
}
