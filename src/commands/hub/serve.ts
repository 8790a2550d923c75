import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {HubServer} from '../../core/checkpoint/hub-server.js'
import {parseSize} from '../../core/checkpoint/hub.js'

export default class HubServe extends PsycheCommand {
  static summary = 'Serve a small Hugging Face Hub API on this machine (for tests and development)'
  static description = `Model repositories stored under --dir: repo create, model info, tree, paths-info, preupload, git-LFS batch (basic and multipart), NDJSON commits and resolve/raw downloads with ranges — the routes @huggingface/hub and Python huggingface_hub use (set HF_HUB_DISABLE_XET=1 for Python). Writes need a token starting with hf_ (or one of --token). Runs until interrupted. Not a production Hub: no users, no access control beyond the token.`
  static examples = [
    '<%= config.bin %> hub serve --dir ./hub-data --port 8080',
    'HF_ENDPOINT=http://127.0.0.1:8080 HF_TOKEN=hf_dev <%= config.bin %> checkpoint upload ./model --repo me/model',
  ]

  static flags = {
    dir: Flags.string({summary: 'where repositories and objects are stored', required: true}),
    host: Flags.string({summary: 'address to listen on', default: '127.0.0.1'}),
    port: Flags.integer({summary: 'TCP port (0: any free port)', default: 0, min: 0, max: 65535}),
    token: Flags.string({summary: 'accept only this write token (repeatable); default: any hf_ token', multiple: true}),
    'multipart-threshold': Flags.string({summary: 'LFS objects above this size are uploaded in parts', default: '64MiB'}),
    'chunk-size': Flags.string({summary: 'part size of multipart uploads', default: '16MiB'}),
    verbose: Flags.boolean({summary: 'log every request to stderr', default: false}),
  }

  async run(): Promise<{url: string; dir: string}> {
    const {flags} = await this.parse(HubServe)
    const hub = await HubServer.start({
      root: flags.dir,
      host: flags.host,
      port: flags.port,
      tokens: flags.token,
      multipartThreshold: parseSize(flags['multipart-threshold'], '--multipart-threshold'),
      chunkSize: parseSize(flags['chunk-size'], '--chunk-size'),
      log: flags.verbose ? (line) => process.stderr.write(`${line}\n`) : undefined,
    })
    const info = {url: hub.url, dir: flags.dir}
    if (this.jsonEnabled()) process.stdout.write(`${JSON.stringify({listening: info})}\n`)
    else this.logToStderr(`Hub API on ${hub.url} (data in ${flags.dir})`)
    await this.shutdown.requested()
    await hub.close()
    return info
  }
}
