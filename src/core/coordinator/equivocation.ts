import {announcementSigningBytes, type ResultAnnouncement} from '../primitives/announcement.js'
import {verifyBytes} from '../primitives/identity.js'

/**
 * Equivocation: a producer that signed two different results for one step. The two signed announcements are
 * the proof; anyone (the coordinator included) checks it with the producer's public key alone, so one honest
 * client that saw both is enough to have the producer ejected.
 */
export interface EquivocationProof {
  a: ResultAnnouncement
  b: ResultAnnouncement
}

const FIELDS = ['run_id', 'step', 'client_id', 'batch_start', 'batch_end', 'commitment', 'size', 'signature'] as const
const HEX_32 = /^[0-9a-f]{64}$/
const HEX_SIG = /^[0-9a-f]{128}$/

function wellFormed(x: unknown): x is ResultAnnouncement {
  if (typeof x !== 'object' || x === null || Array.isArray(x)) return false
  const r = x as Record<string, unknown>
  if (Object.keys(r).length !== FIELDS.length || !FIELDS.every((f) => f in r)) return false
  const uint = (v: unknown) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0
  return (
    typeof r.run_id === 'string' &&
    r.run_id.length <= 1024 &&
    uint(r.step) &&
    uint(r.batch_start) &&
    uint(r.batch_end) &&
    uint(r.size) &&
    typeof r.client_id === 'string' &&
    HEX_32.test(r.client_id) &&
    typeof r.commitment === 'string' &&
    HEX_32.test(r.commitment) &&
    typeof r.signature === 'string' &&
    HEX_SIG.test(r.signature)
  )
}

/**
 * Checks an equivocation proof for run `runId`. Returns the equivocating producer and step, or why the proof
 * does not hold: both announcements well-formed, of this run, by the same producer for the same step, with
 * different contents, and each signature valid under the producer's key.
 */
export function checkEquivocation(proof: unknown, runId: string): {ok: true; producer: string; step: number} | {ok: false; reason: string} {
  const p = proof as Partial<EquivocationProof> | null
  if (typeof p !== 'object' || p === null || !wellFormed(p.a) || !wellFormed(p.b)) return {ok: false, reason: 'the proof must hold two well-formed signed announcements a and b'}
  const {a, b} = p as EquivocationProof
  if (a.run_id !== runId || b.run_id !== runId) return {ok: false, reason: `the announcements are not of run ${runId}`}
  if (a.client_id !== b.client_id) return {ok: false, reason: 'the announcements are by different producers'}
  if (a.step !== b.step) return {ok: false, reason: `the announcements are for different steps (${a.step}, ${b.step})`}
  if (a.commitment === b.commitment && a.batch_start === b.batch_start && a.batch_end === b.batch_end && a.size === b.size) {
    return {ok: false, reason: 'the announcements are of the same result'}
  }
  for (const x of [a, b]) {
    if (!verifyBytes(x.client_id, announcementSigningBytes(x), Buffer.from(x.signature, 'hex'))) return {ok: false, reason: `a signature does not verify against ${x.client_id}`}
  }
  return {ok: true, producer: a.client_id, step: a.step}
}
