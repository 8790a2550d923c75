import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import fc from 'fast-check'
import {AUTHORIZATION_SIZE, decodeAuthorization} from '../../src/core/backend/solana/authorizer.js'
import {METADATA_SIZE, PEER_SIZE, STATE_SIZE, decodeCoordinator, decodeMetadata, decodePeer} from '../../src/core/backend/solana/layout.js'
import {updateInstruction} from '../../src/core/backend/solana/instructions.js'
import {PARTICIPANT_SIZE, TREASURY_SIZE, decodeParticipant, decodeTreasury} from '../../src/core/backend/solana/treasurer.js'
import {deployRun, readRun} from './harness.js'

/** Account bytes come from an RPC node: decoding them either succeeds or throws a RangeError naming the problem. */
function decodesOrRangeError(decode: (b: Uint8Array) => unknown, bytes: Uint8Array): void {
  try {
    decode(bytes)
  } catch (error) {
    assert.ok(error instanceof RangeError, `${(error as Error).constructor.name}: ${(error as Error).message}`)
  }
}

describe('decoders of account bytes (fuzzed)', () => {
  it('coordinator accounts: random lengths, random bytes, and single-byte mutations of a real account', async () => {
    const d = await deployRun('fuzz-run', 1_700_000_000)
    const r = await d.chain.send(d.authority, [
      updateInstruction(
        d.programId,
        d.coordinator,
        d.authority,
        {
          warmup_time: 10,
          cooldown_time: 5,
          epoch_time: 100,
          max_round_train_time: 10,
          round_witness_time: 2,
          min_clients: 1,
          init_min_clients: 1,
          witness_nodes: 1,
          verification_percent: 0,
          global_batch_size_start: 8,
          global_batch_size_end: 8,
          global_batch_size_warmup_tokens: 0,
          total_steps: 10,
          waiting_for_members_extra_time: 3,
        },
        {
          LLM: {
            architecture: 'HfLlama',
            data_type: 'Pretraining',
            max_seq_len: 16,
            cold_start_warmup_steps: 0,
            checkpoint: {Hub: {repo_id: 'o/m'}},
            data_location: 'Dummy',
            lr_schedule: {Constant: {base_lr: 1e-3, warmup_steps: 0, warmup_init_lr: 0}},
            optimizer: 'Dummy',
          },
        },
      ),
    ])
    assert.ok(r.ok, r.error)
    const real = d.chain.accountData(d.coordinator)!
    assert.equal(readRun(d).state.run_id, 'fuzz-run')
    fc.assert(
      fc.property(fc.uint8Array({maxLength: 64}), (b) => decodesOrRangeError(decodeCoordinator, b)),
      {numRuns: 200},
    )
    // Mutations where the decoder looks: the header, the list lengths, the rounds' lengths, the model JSON.
    const hot = fc.oneof(fc.integer({min: 0, max: 900}), fc.integer({min: 11048, max: 11140}), fc.integer({min: 40960, max: 41100}), fc.integer({min: 0, max: STATE_SIZE - 1}))
    fc.assert(
      fc.property(fc.array(fc.tuple(hot, fc.integer({min: 0, max: 255})), {minLength: 1, maxLength: 4}), (edits) => {
        const b = Uint8Array.from(real)
        for (const [at, value] of edits) b[at] = value
        decodesOrRangeError(decodeCoordinator, b)
      }),
      {numRuns: 400},
    )
  })

  it('authorization accounts', () => {
    fc.assert(
      fc.property(fc.uint8Array({minLength: AUTHORIZATION_SIZE, maxLength: AUTHORIZATION_SIZE}), (b) => {
        b.set([0x50, 0x53, 0x59, 0x48, 0x41, 0x55, 0x54, 0x48], 0) // the magic, so the body is decoded
        decodesOrRangeError(decodeAuthorization, b)
      }),
      {numRuns: 300},
    )
    fc.assert(
      fc.property(fc.uint8Array({maxLength: 700}), (b) => decodesOrRangeError(decodeAuthorization, b)),
      {numRuns: 200},
    )
  })

  it('peer records and run metadata records', () => {
    for (const [decode, size, magic] of [
      [decodePeer, PEER_SIZE, 'PSYCPEER'],
      [decodeMetadata, METADATA_SIZE, 'PSYCMETA'],
    ] as const) {
      fc.assert(
        fc.property(fc.uint8Array({minLength: size, maxLength: size}), fc.integer({min: 0, max: 2000}), (b, n) => {
          b.set(Buffer.from(magic), 0) // the magic, so the body is decoded
          if (decode === decodePeer) Buffer.from(b.buffer, b.byteOffset).writeBigUInt64LE(BigInt(n), 72) // plausible lengths too
          decodesOrRangeError(decode, b)
        }),
        {numRuns: 300},
      )
      fc.assert(
        fc.property(fc.uint8Array({maxLength: 1200}), (b) => decodesOrRangeError(decode, b)),
        {numRuns: 200},
      )
    }
  })

  it('treasurer accounts: treasuries and participant records (claimed points past 2^53 refused, token amounts any u64)', () => {
    for (const [decode, size, magic] of [
      [decodeTreasury, TREASURY_SIZE, 'PSYTREAS'],
      [decodeParticipant, PARTICIPANT_SIZE, 'PSYTPART'],
    ] as const) {
      fc.assert(
        fc.property(fc.uint8Array({minLength: size, maxLength: size}), (b) => {
          b.set(Buffer.from(magic), 0) // the magic, so the body is decoded
          decodesOrRangeError(decode, b)
        }),
        {numRuns: 300},
      )
      fc.assert(
        fc.property(fc.uint8Array({maxLength: 300}), (b) => decodesOrRangeError(decode, b)),
        {numRuns: 200},
      )
    }
  })
})
