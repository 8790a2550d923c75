import {randomBytes} from 'node:crypto'
import {writeFileSync} from 'node:fs'
import {execa} from 'execa'
import {projectRoot, pythonEnv, workerPython} from '../../src/core/worker/python.js'

/** Writes a safetensors file of float32 tensors with random values; returns the tensors' bytes by name. */
export function writeSafetensors(path: string, shapes: Record<string, number[]>): Record<string, Buffer> {
  const header: Record<string, unknown> = {__metadata__: {format: 'pt'}}
  const data: Buffer[] = []
  const tensors: Record<string, Buffer> = {}
  let offset = 0
  for (const [name, shape] of Object.entries(shapes).sort(([a], [b]) => a.localeCompare(b))) {
    const bytes = randomBytes(4 * shape.reduce((a, b) => a * b, 1))
    // keep the values finite floats: clear the top exponent bit of each little-endian float32
    for (let i = 3; i < bytes.length; i += 4) bytes[i]! &= 0xbf
    header[name] = {dtype: 'F32', shape, data_offsets: [offset, offset + bytes.length]}
    offset += bytes.length
    data.push(bytes)
    tensors[name] = bytes
  }
  let text = JSON.stringify(header)
  text += ' '.repeat((8 - (text.length % 8)) % 8)
  const length = Buffer.alloc(8)
  length.writeBigUInt64LE(BigInt(text.length))
  writeFileSync(path, Buffer.concat([length, Buffer.from(text), ...data]))
  return tensors
}

/** Runs a Python snippet in the project's venv (huggingface_hub without Xet) and parses its last stdout line as JSON. */
export async function python(code: string, env: Record<string, string> = {}): Promise<any> {
  const r = await execa(workerPython(), ['-c', code], {
    cwd: projectRoot,
    env: pythonEnv({HF_HUB_DISABLE_XET: '1', HF_HUB_DISABLE_PROGRESS_BARS: '1', HF_HUB_DISABLE_TELEMETRY: '1', HF_HUB_OFFLINE: '0', ...env}),
    reject: false,
  })
  if (r.exitCode !== 0) throw new Error(`python failed (${r.exitCode}): ${r.stderr}`)
  return JSON.parse(String(r.stdout).trim().split('\n').pop()!)
}
