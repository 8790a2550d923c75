import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {Progress} from '../../core/cli/progress.js'
import {DEFAULT_HUB_URL, downloadCheckpoint, transferLabel, type DownloadResult} from '../../core/checkpoint/hub.js'

const mib = (n: number) => (n / 1024 / 1024).toFixed(1)

export default class CheckpointDownload extends PsycheCommand {
  static summary = 'Download a revision of a Hugging Face Hub model repository'
  static description = `Files go to the Hub cache (--cache-dir, HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub, in huggingface_hub's layout) and are then placed in --out, atomically. An interrupted download resumes where it stopped; every file is checked against the Hub's hash (sha256 for LFS files, the git blob id otherwise) before it is used; files already in the cache are not fetched again.

Exit codes: 0 downloaded; 1 bad input (repository id, token, --out not empty); 3 the Hub refused or could not be reached (unknown repository or revision); 4 a file did not match its hash.`
  static examples = [
    '<%= config.bin %> checkpoint download --repo my-org/my-model --out ./model',
    '<%= config.bin %> checkpoint download --repo me/model --revision 3f2a... --out ./model --hub-url http://127.0.0.1:8080 --json',
  ]

  static flags = {
    repo: Flags.string({summary: 'Hub repository id, NAMESPACE/NAME', required: true}),
    revision: Flags.string({summary: 'branch or commit id', default: 'main'}),
    out: Flags.string({summary: 'directory to place the model in (must be empty or absent unless --force)', required: true}),
    force: Flags.boolean({summary: 'replace a non-empty --out', default: false}),
    'cache-dir': Flags.string({summary: 'Hub cache directory'}),
    'hub-url': Flags.string({summary: 'Hub endpoint', env: 'HF_ENDPOINT', default: DEFAULT_HUB_URL}),
    token: Flags.string({summary: 'Hub token (starts with hf_); only needed for private repositories', env: 'HF_TOKEN'}),
  }

  async run(): Promise<DownloadResult> {
    const {flags} = await this.parse(CheckpointDownload)
    const progress = Progress.for({json: this.jsonEnabled()})
    try {
      const result = await downloadCheckpoint({
        repo: flags.repo,
        revision: flags.revision,
        out: flags.out,
        force: flags.force,
        cacheDir: flags['cache-dir'],
        hubUrl: flags['hub-url'],
        token: flags.token,
        onProgress: (p) => progress.update(transferLabel(p), p.phase === 'done'),
      })
      progress.done(
        `downloaded ${result.repo}@${result.commit.slice(0, 12)}: ${result.files.length} files, ${mib(result.bytes)} MiB (${mib(result.downloaded_bytes)} MiB fetched) in ${result.seconds.toFixed(1)} s`,
      )
      if (!this.jsonEnabled()) this.log(result.dir)
      return result
    } catch (error) {
      progress.fail('download failed')
      throw error
    }
  }
}
