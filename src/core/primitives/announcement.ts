import {sha256Hex} from './hash.js'
import {signBytes, verifyBytes, type Identity} from './identity.js'

/** The identity a node signs with (the coordinator identity: id = hex of the raw ed25519 public key). */
export type SigningIdentity = Identity

/** A small signed gossip message: "I produced the result for these batches; its bytes hash to commitment". */
export interface ResultAnnouncement {
  run_id: string
  step: number
  client_id: string
  batch_start: number
  /** exclusive */
  batch_end: number
  /** the blob's commitment, hex: primitives/pieces.ts resultCommitment (the root of its hash list) */
  commitment: string
  size: number
  /** hex ed25519 signature over announcementSigningBytes() */
  signature: string
}

type UnsignedAnnouncement = Omit<ResultAnnouncement, 'signature'>

/** Gossip messages larger than this are not announcements (they are a few hundred bytes). */
export const MAX_ANNOUNCEMENT_BYTES = 4096

const DOMAIN = 'psyche/result-announcement/1\n'
const HEX_32 = /^[0-9a-f]{64}$/
const HEX_SIG = /^[0-9a-f]{128}$/

export {sha256Hex}

/** The bytes that are signed: a domain tag and the fields in a fixed order, so no field can be moved into another. */
export function announcementSigningBytes(a: UnsignedAnnouncement): Uint8Array {
  return Buffer.from(DOMAIN + JSON.stringify([a.run_id, a.step, a.client_id, a.batch_start, a.batch_end, a.commitment, a.size]), 'utf8')
}

export function signAnnouncement(identity: SigningIdentity, fields: UnsignedAnnouncement): ResultAnnouncement {
  const signature = Buffer.from(signBytes(identity, announcementSigningBytes(fields))).toString('hex')
  return {...fields, signature}
}

function isUint(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0
}

/**
 * Parses and checks an announcement from the wire. Returns the announcement, or the reason it is rejected.
 * Checks shape, bounds, run id, and the ed25519 signature against client_id (so client_id must be the signer).
 */
export function parseAnnouncement(bytes: Uint8Array, runId: string): {ok: true; announcement: ResultAnnouncement} | {ok: false; reason: string} {
  if (bytes.length > MAX_ANNOUNCEMENT_BYTES) return {ok: false, reason: `announcement is ${bytes.length} bytes (max ${MAX_ANNOUNCEMENT_BYTES})`}
  let raw: unknown
  try {
    raw = JSON.parse(Buffer.from(bytes).toString('utf8'))
  } catch {
    return {ok: false, reason: 'announcement is not JSON'}
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return {ok: false, reason: 'announcement is not an object'}
  const r = raw as Record<string, unknown>
  if (typeof r.run_id !== 'string') return {ok: false, reason: 'run_id is not a string'}
  if (r.run_id !== runId) return {ok: false, reason: `run_id ${JSON.stringify(r.run_id).slice(0, 80)} is not this run (${runId})`}
  for (const field of ['step', 'batch_start', 'batch_end', 'size'] as const) {
    if (!isUint(r[field])) return {ok: false, reason: `${field} is not a non-negative integer`}
  }
  if ((r.batch_end as number) <= (r.batch_start as number)) return {ok: false, reason: 'batch_end is not greater than batch_start'}
  if (typeof r.client_id !== 'string' || !HEX_32.test(r.client_id)) return {ok: false, reason: 'client_id is not a 32-byte lowercase hex public key'}
  if (typeof r.commitment !== 'string' || !HEX_32.test(r.commitment)) return {ok: false, reason: 'commitment is not a sha256 lowercase hex digest'}
  if (typeof r.signature !== 'string' || !HEX_SIG.test(r.signature)) return {ok: false, reason: 'signature is not 64 bytes of lowercase hex'}
  const a: ResultAnnouncement = {
    run_id: r.run_id,
    step: r.step as number,
    client_id: r.client_id,
    batch_start: r.batch_start as number,
    batch_end: r.batch_end as number,
    commitment: r.commitment,
    size: r.size as number,
    signature: r.signature,
  }
  if (!verifyBytes(a.client_id, announcementSigningBytes(a), Buffer.from(a.signature, 'hex')))
    return {ok: false, reason: `signature does not verify against client_id ${a.client_id.slice(0, 16)}…`}
  return {ok: true, announcement: a}
}

export function encodeAnnouncement(a: ResultAnnouncement): Uint8Array {
  return Buffer.from(JSON.stringify(a), 'utf8')
}
