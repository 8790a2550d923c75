import {Args, Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {Progress} from '../../core/cli/progress.js'
import {DEFAULT_HUB_URL, parseSize, transferLabel, uploadCheckpoint, type UploadResult} from '../../core/checkpoint/hub.js'

const mib = (n: number) => (n / 1024 / 1024).toFixed(1)

export default class CheckpointUpload extends PsycheCommand {
  static summary = 'Upload a model directory to a Hugging Face Hub repository as one commit'
  static description = `Creates the repository (and branch) when missing and uploads every file of DIR (files starting with "." are skipped); LFS for weights. A model.safetensors bigger than --max-shard-size is uploaded as shards (model-00001-of-0000N.safetensors + model.safetensors.index.json), read straight from the file. The commit names the branch head it builds on, so a concurrent writer makes it fail rather than be overwritten.

Exit codes: 0 uploaded; 1 bad input (directory, repository id, token); 3 the Hub refused or could not be reached.`
  static examples = [
    'HF_TOKEN=hf_... <%= config.bin %> checkpoint upload ./checkpoints/step-1000 --repo my-org/my-model --message "step 1000"',
    '<%= config.bin %> checkpoint upload ./model --repo me/model --revision run-2 --max-shard-size 2GB --hub-url http://127.0.0.1:8080 --json',
  ]

  static args = {dir: Args.string({description: 'the model directory (config.json, model.safetensors, tokenizer files, README.md)', required: true})}
  static flags = {
    repo: Flags.string({summary: 'Hub repository id, NAMESPACE/NAME', required: true}),
    revision: Flags.string({summary: 'branch to commit to', default: 'main'}),
    message: Flags.string({summary: 'commit message'}),
    'max-shard-size': Flags.string({summary: 'shard model.safetensors above this size (e.g. 5GB, 500MiB)', default: '5GB'}),
    'hub-url': Flags.string({summary: 'Hub endpoint', env: 'HF_ENDPOINT', default: DEFAULT_HUB_URL}),
    token: Flags.string({summary: 'Hub token (starts with hf_)', env: 'HF_TOKEN'}),
  }

  async run(): Promise<UploadResult> {
    const {args, flags} = await this.parse(CheckpointUpload)
    const progress = Progress.for({json: this.jsonEnabled()})
    try {
      const result = await uploadCheckpoint({
        dir: args.dir,
        repo: flags.repo,
        revision: flags.revision,
        message: flags.message,
        hubUrl: flags['hub-url'],
        token: flags.token,
        maxShardBytes: parseSize(flags['max-shard-size'], '--max-shard-size'),
        onProgress: (p) => progress.update(transferLabel(p), p.phase !== 'uploading'),
      })
      progress.done(
        `uploaded ${result.files.length} files (${mib(result.bytes)} MiB${result.sharded ? ', sharded' : ''}) to ${result.repo}@${result.revision} as ${result.commit.slice(0, 12)} in ${result.seconds.toFixed(1)} s`,
      )
      if (!this.jsonEnabled()) this.log(result.commit)
      return result
    } catch (error) {
      progress.fail('upload failed')
      throw error
    }
  }
}
