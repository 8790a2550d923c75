/**
 * "I hold these results" (/psyche/have/1): a client that got a result tells the peers it is connected to, so they
 * fetch it from it rather than from its producer (result-exchange.ts: swarmed downloads). Each client keeps one
 * long-lived stream of these to each connected peer, a frame per batch. A binary frame: the step
 * (u32, big-endian), then the first HAVE_PREFIX_BYTES of each result's commitment. A prefix only steers where a
 * result is asked for: what arrives is checked against the full commitment. Pure.
 */
export const HAVE_PROTOCOL = '/psyche/have/1'
export const HAVE_PREFIX_BYTES = 8
/** At most this many results per message (a round has one per trainer; more are sent as several messages). */
export const MAX_HAVES_PER_MESSAGE = 1024
export const MAX_HAVE_MESSAGE_BYTES = 4 + HAVE_PREFIX_BYTES * MAX_HAVES_PER_MESSAGE

interface HaveMessage {
  step: number
  /** commitment prefixes, hex */
  prefixes: string[]
}

/** The prefix of a commitment (hex) that a have message carries. */
export function havePrefix(commitment: string): string {
  return commitment.slice(0, 2 * HAVE_PREFIX_BYTES).toLowerCase()
}

export function encodeHave(step: number, commitments: readonly string[]): Uint8Array {
  if (!Number.isInteger(step) || step < 0 || step > 0xffffffff) throw new RangeError(`step ${step} is not a u32`)
  if (commitments.length > MAX_HAVES_PER_MESSAGE) throw new RangeError(`${commitments.length} results in one have message, more than ${MAX_HAVES_PER_MESSAGE}`)
  const out = Buffer.alloc(4 + HAVE_PREFIX_BYTES * commitments.length)
  out.writeUInt32BE(step, 0)
  commitments.forEach((c, i) => {
    const prefix = Buffer.from(havePrefix(c), 'hex')
    if (prefix.length !== HAVE_PREFIX_BYTES) throw new RangeError(`commitment ${c.slice(0, 20)} is not hex of at least ${HAVE_PREFIX_BYTES} bytes`)
    prefix.copy(out, 4 + i * HAVE_PREFIX_BYTES)
  })
  return out
}

/** Parses a have message from a peer; a malformed one is refused with a reason. */
export function parseHave(bytes: Uint8Array): {ok: true; have: HaveMessage} | {ok: false; reason: string} {
  if (bytes.length > MAX_HAVE_MESSAGE_BYTES) return {ok: false, reason: `have message of ${bytes.length} bytes, more than ${MAX_HAVE_MESSAGE_BYTES}`}
  if (bytes.length < 4 || (bytes.length - 4) % HAVE_PREFIX_BYTES !== 0)
    return {ok: false, reason: `have message of ${bytes.length} bytes is not a step and whole ${HAVE_PREFIX_BYTES}-byte prefixes`}
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length)
  const step = buf.readUInt32BE(0)
  const prefixes: string[] = []
  for (let at = 4; at < buf.length; at += HAVE_PREFIX_BYTES) prefixes.push(buf.subarray(at, at + HAVE_PREFIX_BYTES).toString('hex'))
  return {ok: true, have: {step, prefixes}}
}
