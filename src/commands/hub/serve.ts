import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {HUB_SERVER_DEFAULTS, HubServer, type HubToken} from '../../core/checkpoint/hub-server.js'
import {parseSize} from '../../core/checkpoint/hub.js'
import {PsycheError} from '../../core/errors.js'

const NAMESPACE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/

/** `hf_…` or `NAMESPACE:hf_…` (the token writes to that namespace only). */
export function parseTokenFlag(value: string): HubToken {
  const colon = value.indexOf(':')
  const [user, token] = colon < 0 ? [undefined, value] : [value.slice(0, colon), value.slice(colon + 1)]
  if (!token.startsWith('hf_') || token.length < 4 || /\s/.test(token)) throw new PsycheError('--token: expected hf_… or NAMESPACE:hf_…', {exitCode: 2})
  if (user === undefined) return token
  if (!NAMESPACE.test(user)) throw new PsycheError(`--token: ${user} is not a namespace name`, {exitCode: 2})
  return {token, user}
}

const GIB = 1024 ** 3
const MIB = 1024 ** 2

export default class HubServe extends PsycheCommand {
  static summary = 'Serve a small Hugging Face Hub API on this machine (for tests and development)'
  static description = `Model and dataset repositories stored under --dir: repo create, model and dataset info, tree, paths-info, preupload, git-LFS batch (basic and multipart), NDJSON commits and resolve/raw downloads with ranges — the routes @huggingface/hub and Python huggingface_hub use (set HF_HUB_DISABLE_XET=1 for Python). Writes need a token starting with hf_ (or one of --token). A token writes only to its own namespaces: the one it is bound to with --token NAMESPACE:hf_…, otherwise those it was the first to write to (recorded under --dir). Private repositories are readable by their namespace's tokens only. Upload URLs are handed out by the token-checked LFS batch API, one per object, and expire when idle for --upload-ttl. Runs until interrupted.`
  static examples = [
    '<%= config.bin %> hub serve --dir ./hub-data --port 8080',
    'HF_ENDPOINT=http://127.0.0.1:8080 HF_TOKEN=hf_dev <%= config.bin %> checkpoint upload ./model --repo me/model',
  ]

  static flags = {
    dir: Flags.string({summary: 'where repositories and objects are stored', required: true}),
    host: Flags.string({summary: 'address to listen on', default: '127.0.0.1'}),
    port: Flags.integer({summary: 'TCP port (0: any free port)', default: 0, min: 0, max: 65535}),
    token: Flags.string({
      summary: 'accept only this write token, hf_… or NAMESPACE:hf_… (bound to that namespace); repeatable; default: any hf_ token, owning the namespaces it writes to first',
      multiple: true,
    }),
    'max-file-size': Flags.string({summary: 'biggest file a client may upload', default: `${HUB_SERVER_DEFAULTS.maxFileSize / GIB}GiB`}),
    'max-parts': Flags.integer({summary: 'most parts of one multipart upload (the part size grows to fit)', default: HUB_SERVER_DEFAULTS.maxParts, min: 1}),
    'max-request-body': Flags.string({summary: 'biggest JSON/NDJSON request body (commits carry small files inline)', default: `${HUB_SERVER_DEFAULTS.maxBodyBytes / MIB}MiB`}),
    'upload-ttl': Flags.integer({
      summary: 'seconds an unfinished upload may sit idle before it and its parts are deleted',
      default: HUB_SERVER_DEFAULTS.uploadTtlMs / 1000,
      min: 1,
    }),
    'max-pending-uploads': Flags.integer({summary: 'unfinished uploads kept at once', default: HUB_SERVER_DEFAULTS.maxPendingUploads, min: 1}),
    'max-connections': Flags.integer({summary: 'open connections at once', default: HUB_SERVER_DEFAULTS.maxConnections, min: 1}),
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
      tokens: flags.token?.map(parseTokenFlag),
      maxFileSize: parseSize(flags['max-file-size'], '--max-file-size'),
      maxParts: flags['max-parts'],
      maxBodyBytes: parseSize(flags['max-request-body'], '--max-request-body'),
      uploadTtlMs: flags['upload-ttl'] * 1000,
      maxPendingUploads: flags['max-pending-uploads'],
      maxConnections: flags['max-connections'],
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
