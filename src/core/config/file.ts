import {readFile} from 'node:fs/promises'
import {ConfigError} from './read.js'

/** A config file's text; a file that cannot be read is a ConfigError naming it. */
export async function readConfigText(path: string): Promise<string> {
  try {
    return await readFile(path, 'utf8')
  } catch (error) {
    throw new ConfigError([{file: path, path: '', message: `cannot read: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`}])
  }
}
