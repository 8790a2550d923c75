import {readFileSync} from 'node:fs'

/** Descriptors kept free for everything else a server opens (saved state, logs, the relay, the data server). */
const RESERVED_DESCRIPTORS = 128

/** This process's soft limit on open files (`ulimit -n`), or undefined where it cannot be read (not Linux). */
export function openFileLimit(limitsText?: string): number | undefined {
  let text = limitsText
  if (text === undefined) {
    try {
      text = readFileSync('/proc/self/limits', 'utf8')
    } catch {
      return undefined
    }
  }
  const m = /^Max open files\s+(\d+|unlimited)\s+/m.exec(text)
  if (!m) return undefined
  return m[1] === 'unlimited' ? undefined : Number(m[1])
}

/**
 * The connection bound actually used: the one asked for, but never so many that accepting them would take the
 * descriptors the server needs to save its state (EMFILE). Returns the bound and, when lowered, why.
 */
export function effectiveMaxConnections(requested: number, fileLimit = openFileLimit(), flag = '--max-connections'): {max: number; lowered?: string} {
  if (fileLimit === undefined) return {max: requested}
  const room = Math.max(16, fileLimit - RESERVED_DESCRIPTORS)
  if (requested <= room) return {max: requested}
  return {max: room, lowered: `${flag} ${requested} is above what ulimit -n ${fileLimit} leaves (${room}, keeping ${RESERVED_DESCRIPTORS} descriptors free)`}
}
