import {dirname, isAbsolute, resolve} from 'node:path'
import {loadDataServerConfig} from '../config/data-config.js'
import type {DataServerConfig} from '../config/types.js'
import {LocalTokenDataset} from './local.js'
import {parseShuffle} from './shuffle.js'
import {DataServer, type DataServerLimits} from './tcp.js'
import {parseTokenSize} from './token-file.js'

/** A TCP data server opened from a data.toml, with what it serves. */
interface OpenedDataServer {
  server: DataServer
  config: DataServerConfig
  /** The token directory (a relative `dir` is relative to the data.toml). */
  dir: string
  samples: number
  vocabSize: number | undefined
  shuffled: boolean
  /** Stops the server and closes the token files. */
  close(): Promise<void>
}

/**
 * Opens the token directory a data.toml names and serves it over TCP (`psyche data serve`, and `psyche server
 * run --data-config`). `check` sees the parsed config before anything is opened (e.g. against the run's); a
 * `port` function is read after it.
 */
export async function openDataServer(
  path: string,
  options: {host: string; port: number | (() => number); log?: (line: string) => void; check?: (config: DataServerConfig) => void; limits?: Partial<DataServerLimits>},
): Promise<OpenedDataServer> {
  const config = await loadDataServerConfig(path)
  options.check?.(config)
  const port = typeof options.port === 'function' ? options.port() : options.port
  const dir = isAbsolute(config.dir) ? config.dir : resolve(dirname(path), config.dir)
  const dataset = await LocalTokenDataset.open(dir, {tokenSize: parseTokenSize(config.token_size, `${path}: token_size`)})
  try {
    const shuffleSeed = parseShuffle(config.shuffle_seed, `${path}: shuffle_seed`)
    const provider = dataset.provider({seqLen: config.seq_len, shuffleSeed})
    const server = await DataServer.start(provider, {host: options.host, port, log: options.log, limits: options.limits})
    return {
      server,
      config,
      dir,
      samples: provider.numSamples(),
      vocabSize: provider.vocabSize(),
      shuffled: Boolean(shuffleSeed),
      close: async () => {
        await server.close()
        await dataset.close()
      },
    }
  } catch (error) {
    await dataset.close()
    throw error
  }
}
