import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {DataServer, LocalTokenDataset, loadDataServerConfig} from '../../core/data/index.js'

export default class DataServe extends PsycheCommand {
  static summary = 'Serve a token directory to the clients of a run over TCP (data_location.Server)'
  static description = `Reads Psyche's data.toml (dir, token_size, seq_len, shuffle_seed; dir is relative to the data.toml) and answers clients' batch requests with the same samples a Local or Http provider would give. Runs until interrupted.`
  static examples = ['<%= config.bin %> data serve --data-config data.toml', '<%= config.bin %> data serve --data-config data.toml --port 20001 --host 127.0.0.1']

  static flags = {
    'data-config': Flags.string({summary: 'path to data.toml', required: true}),
    port: Flags.integer({summary: 'TCP port (0: any free port)', default: 20001, min: 0, max: 65535}),
    host: Flags.string({summary: 'address to listen on', default: '0.0.0.0'}),
  }

  async run(): Promise<{host: string; port: number; dir: string; seqLen: number; samples: number; vocabSize: number | null}> {
    const {flags} = await this.parse(DataServe)
    const config = await loadDataServerConfig(flags['data-config'])
    const dataset = await LocalTokenDataset.open(config.dir, {tokenSize: config.tokenSize})
    const provider = dataset.provider({seqLen: config.seqLen, shuffleSeed: config.shuffleSeed})
    const server = await DataServer.start(provider, {host: flags.host, port: flags.port, log: (line) => this.logToStderr(line)})
    const info = {host: flags.host, port: server.port, dir: config.dir, seqLen: config.seqLen, samples: provider.numSamples(), vocabSize: provider.vocabSize() ?? null}
    const line = `serving ${info.samples} samples of ${config.seqLen + 1} tokens from ${config.dir} on ${flags.host}:${server.port}${config.shuffleSeed ? ' (shuffled)' : ''}`
    // --json prints one object when listening (stdout), since the command only returns once stopped.
    if (this.jsonEnabled()) process.stdout.write(`${JSON.stringify({listening: info})}\n`)
    else this.logToStderr(line)
    await new Promise<void>((resolve) => {
      process.once('SIGINT', resolve)
      process.once('SIGTERM', resolve)
    })
    await server.close()
    await dataset.close()
    return info
  }
}
