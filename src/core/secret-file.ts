import {open} from 'node:fs/promises'
import {PsycheError} from './errors.js'

/**
 * Reads a file that holds a secret key (an identity, a Solana keypair), refusing it, as ssh refuses a private
 * key, when its permissions let the group or others at it: anyone else on the machine could take the key.
 * The mode is checked on the opened file (fstat), so a file swapped in between cannot slip past.
 */
export async function readSecretFile(path: string, what: string): Promise<string> {
  const handle = await open(path, 'r')
  try {
    const stat = await handle.stat()
    if (process.platform !== 'win32' && (stat.mode & 0o077) !== 0) {
      const mode = (stat.mode & 0o777).toString(8).padStart(4, '0')
      throw new PsycheError(`${what} ${path}: permissions ${mode} are too open: it holds a secret key that group or others can access; run chmod 600 ${path}`, {
        code: 'EPERMISSIONS',
      })
    }
    return await handle.readFile('utf8')
  } finally {
    await handle.close()
  }
}
