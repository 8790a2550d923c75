import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {DEFAULT_DATA_SERVER_LIMITS, openDataServer} from '../../core/data/index.js'

export default class DataServe extends PsycheCommand {
  static summary = 'Serve a token directory to the clients of a run over TCP (data_location.Server)'
  static description = `Reads Psyche's data.toml (dir, token_size, seq_len, shuffle_seed; a relative dir is relative to the data.toml) and answers clients' batch requests with the same samples a Local or Http provider would give. Runs until interrupted.`
  static examples = ['<%= config.bin %> data serve --data-config data.toml', '<%= config.bin %> data serve --data-config data.toml --port 20001 --host 127.0.0.1']

  static flags = {
    'data-config': Flags.string({summary: 'path to data.toml', required: true}),
    port: Flags.integer({summary: 'TCP port (0: any free port)', default: 20001, min: 0, max: 65535}),
    host: Flags.string({summary: 'address to listen on', default: '0.0.0.0'}),
    'max-connections': Flags.integer({
      summary: 'most client connections open at once (lowered to what ulimit -n leaves room for); more are refused',
      default: DEFAULT_DATA_SERVER_LIMITS.maxConnections,
      min: 1,
    }),
    'max-connections-per-ip': Flags.integer({summary: 'most connections open at once from one IP address', default: DEFAULT_DATA_SERVER_LIMITS.maxConnectionsPerIp, min: 1}),
    'max-unsent-bytes': Flags.integer({
      summary: 'answer bytes queued for a client before the server waits for it to read (and stops reading its requests)',
      default: DEFAULT_DATA_SERVER_LIMITS.maxUnsentBytes,
      min: 65536,
    }),
    'stall-timeout-s': Flags.integer({
      summary: 'close a connection whose queued answers are not read for this long',
      default: DEFAULT_DATA_SERVER_LIMITS.stallTimeoutMs / 1000,
      min: 1,
    }),
  }

  async run(): Promise<{host: string; port: number; dir: string; seq_len: number; samples: number; vocab_size: number | null}> {
    const {flags} = await this.parse(DataServe)
    const path = flags['data-config']
    const opened = await openDataServer(path, {
      host: flags.host,
      port: flags.port,
      log: (line) => this.logToStderr(line),
      limits: {
        maxConnections: flags['max-connections'],
        maxConnectionsPerIp: flags['max-connections-per-ip'],
        maxUnsentBytes: flags['max-unsent-bytes'],
        stallTimeoutMs: flags['stall-timeout-s'] * 1000,
      },
    })
    const {server, config, dir} = opened
    const info = {host: flags.host, port: server.port, dir, seq_len: config.seq_len, samples: opened.samples, vocab_size: opened.vocabSize ?? null}
    // --json prints one object once listening, since the command only returns when stopped.
    if (this.jsonEnabled()) process.stdout.write(`${JSON.stringify({listening: info})}\n`)
    else this.logToStderr(`serving ${info.samples} samples of ${config.seq_len + 1} tokens from ${dir} on ${flags.host}:${server.port}${opened.shuffled ? ' (shuffled)' : ''}`)
    await this.shutdown.requested()
    await opened.close()
    return info
  }
}
