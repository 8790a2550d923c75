import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {snakeKeys, type SnakeKeys} from '../../core/cli/json.js'
import {Progress} from '../../core/cli/progress.js'
import {type CreatedModel, createModelFromTemplate} from '../../core/model.js'

export default class ModelInit extends PsycheCommand {
  static summary = 'Create a randomly initialised model (Hugging Face layout) from a template'
  static description =
    'Writes config.json, model.safetensors, tokenizer.json + tokenizer_config.json and a model card (README.md), loadable by transformers AutoModelForCausalLM / AutoTokenizer.from_pretrained. Templates live in templates/NAME/model/config.json (tiny-demo: ~1.5M parameters for CPUs; llama2-20m: the Psyche llama2-20m shape).'
  static examples = [
    '<%= config.bin %> model init --template tiny-demo --out run/model',
    '<%= config.bin %> model init --out myrun/model   # after psyche init: uses myrun/model/config.json',
    '<%= config.bin %> model init --template llama2-20m --out m --seed 3 --json',
  ]

  static flags = {
    template: Flags.string({summary: 'template name (a folder of templates/); default: the config.json already in --out, else tiny-demo'}),
    out: Flags.string({summary: 'output directory', required: true}),
    seed: Flags.integer({summary: 'initialisation seed', default: 0}),
    force: Flags.boolean({summary: 'replace a non-empty output directory'}),
    tokenizer: Flags.string({summary: 'tokenizer.json to save with the model (default: one already in --out, else a byte-level tokenizer)'}),
  }

  async run(): Promise<SnakeKeys<CreatedModel>> {
    const {flags} = await this.parse(ModelInit)
    const progress = Progress.for({json: this.jsonEnabled()})
    progress.status(`initialising ${flags.template ?? 'the model'} (seed ${flags.seed})`)
    const created = await createModelFromTemplate({template: flags.template, out: flags.out, seed: flags.seed, force: flags.force, tokenizer: flags.tokenizer})
    progress.done(`${created.parameters.toLocaleString('en-US')} parameters written to ${created.dir}`)
    return snakeKeys(created)
  }
}
