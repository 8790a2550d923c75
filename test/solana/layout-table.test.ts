// The layout table (src/core/layout/layout-table.ts) is the one source of the coordinator account's shape: the
// committed C header is generated from it, the programs define none of its constants or structs themselves, and the
// TypeScript decoder reads accounts at the offsets it computes.
import {describe, it} from 'node:test'
import assert from 'node:assert/strict'
import {readFileSync, readdirSync} from 'node:fs'
import {join} from 'node:path'
import {CONFIG_FIELDS, CONSTANTS, MAGICS, RUN_ID_MAX, STRUCTS, structLayout, enumValues} from '../../src/core/layout/layout-table.js'
import {LAYOUT_HEADER, layoutHeader} from '../../scripts/gen-layout.js'
import {IX, PROGRAM_ERRORS, STATE_SIZE, PEER_SIZE, METADATA_SIZE, decodeCoordinator, encodeUpdate} from '../../src/core/backend/solana/layout.js'
import {AUTHORIZATION_SIZE} from '../../src/core/backend/solana/authorizer.js'
import {LIMITS, SPARSELOCO_LIMITS, validateRunConfig} from '../../src/core/config/run-config.js'
import type {SparseLoCoConfig} from '../../src/core/config/types.js'
import {testConfig, testModel} from './harness.js'
import {sparseLoCo} from './vectors.js'
import {loadRunConfigFile, parseRunConfig} from '../../src/core/config/run-config-file.js'

const root = join(import.meta.dirname, '..', '..')

describe('layout table', () => {
  it('the committed C header is what the table generates (npm run build:programs rewrites it)', () => {
    assert.equal(readFileSync(join(root, LAYOUT_HEADER), 'utf8'), layoutHeader(), `${LAYOUT_HEADER} is stale: run npm run build:programs`)
  })

  it('the programs define none of the table constants, enums or structs themselves', () => {
    const names = [...Object.keys(CONSTANTS), ...Object.keys(MAGICS)]
    for (const dir of ['programs/coordinator', 'programs/authorizer', 'programs/treasurer']) {
      for (const file of readdirSync(join(root, dir)).filter((f) => f.endsWith('.c') || f.endsWith('.h'))) {
        const text = readFileSync(join(root, dir, file), 'utf8')
        assert.match(text, /#include "\.\.\/include\/psyche_layout\.h"/, `${dir}/${file} includes the generated header`)
        for (const name of names) assert.doesNotMatch(text, new RegExp(`#define ${name}\\b`), `${dir}/${file} defines ${name} itself`)
        for (const name of Object.keys(STRUCTS)) assert.doesNotMatch(text, new RegExp(`}\\s*${name};`), `${dir}/${file} declares struct ${name} itself`)
        assert.doesNotMatch(text, /\bE_[A-Z_]+ = \d+/, `${dir}/${file} numbers error codes itself`)
      }
    }
  })

  it('lays structs out as C does: every field aligned, no implicit padding, sizes add up', () => {
    for (const name of Object.keys(STRUCTS) as (keyof typeof STRUCTS)[]) {
      const l = structLayout(name)
      let at = 0
      for (const f of l.fields) {
        assert.equal(f.offset, at, `${name}.${f.name} follows the previous field`)
        assert.equal(
          f.offset %
            Math.min(
              8,
              f.type in STRUCTS
                ? structLayout(f.type as keyof typeof STRUCTS).align
                : f.size /
                    Math.max(
                      1,
                      f.dims.reduce((a, d) => a * d, 1),
                    ),
            ),
          0,
        )
        at += f.size
      }
      assert.equal(l.size, at)
      assert.equal(l.size % l.align, 0)
    }
    assert.equal(STATE_SIZE, structLayout('State').size)
    assert.equal(PEER_SIZE, structLayout('Peer').size)
    assert.equal(METADATA_SIZE, structLayout('Metadata').size)
    assert.equal(AUTHORIZATION_SIZE, structLayout('Authorization').size)
    // the header asserts the same numbers for clang
    const header = layoutHeader()
    assert.match(header, new RegExp(`_Static_assert\\(sizeof\\(State\\) == ${STATE_SIZE}, `))
    const round = structLayout('State').at.round
    assert.match(header, new RegExp(`_Static_assert\\(__builtin_offsetof\\(State, round\\) == ${round.offset}, `))
  })

  it('the decoder reads every field where the table puts it', () => {
    const S = structLayout('State').at
    const b = Buffer.alloc(STATE_SIZE)
    b.writeBigUInt64LE(MAGICS.MAGIC[0], S.magic.offset)
    b.writeBigUInt64LE(MAGICS.LAYOUT_VERSION[0], S.version.offset)
    b.write('table-run', S.run_id.offset)
    b.writeBigUInt64LE(9n, S.run_id_len.offset)
    b.writeBigUInt64LE(BigInt(enumValues('RunState').Paused), S.run_state.offset)
    const config = structLayout('Config')
    config.fields.forEach((f, i) => b.writeBigUInt64LE(BigInt(i + 1), S.config.offset + f.offset))
    b.writeBigUInt64LE(7n, S.progress_step.offset)
    b.writeBigUInt64LE(2n, S.clients_len.offset)
    const C = structLayout('ClientRec')
    for (let i = 0; i < 2; i++) {
      b.fill(0xa0 + i, S.clients.offset + i * S.clients.stride + C.at.key.offset, S.clients.offset + i * S.clients.stride + C.at.key.offset + 32)
      b.writeBigUInt64LE(BigInt(enumValues('ClientState').Ejected), S.clients.offset + i * S.clients.stride + C.at.state.offset)
    }
    b.writeBigUInt64LE(1n, S.has_round.offset)
    const R = structLayout('Round').at
    b.writeBigUInt64LE(5n, S.round.offset + R.step.offset)
    b.writeBigUInt64LE(1n, S.round.offset + R.roster_len.offset)
    b.fill(0xcc, S.round.offset + R.roster.offset, S.round.offset + R.roster.offset + 32)
    b.fill(0xee, S.seed.offset, S.seed.offset + 32)
    const json = Buffer.from('{"architecture":"HfLlama"}')
    b.writeBigUInt64LE(BigInt(json.length), S.model_json_len.offset)
    json.copy(b, S.model_json.offset)
    const d = decodeCoordinator(b)
    assert.equal(d.state.run_id, 'table-run')
    assert.equal(d.state.run_state, 'Paused')
    assert.equal(d.state.progress.step, 7)
    assert.equal(d.state.seed, 'ee'.repeat(32))
    assert.deepEqual(
      CONFIG_FIELDS.map((f) => (d.state.config as unknown as Record<string, number>)[f]),
      CONFIG_FIELDS.map((_, i) => i + 1),
    )
    assert.deepEqual(
      d.state.epoch.clients.map((c) => [c.id, c.state]),
      [
        ['a0'.repeat(32), 'Ejected'],
        ['a1'.repeat(32), 'Ejected'],
      ],
    )
    assert.equal(d.state.epoch.round?.step, 5)
    assert.deepEqual(d.state.epoch.round?.roster, ['cc'.repeat(32)])
    assert.equal((d.state.model.LLM as unknown as {architecture: string}).architecture, 'HfLlama')
  })

  it("SparseLoCo's inner_steps: the account's field, put back into the model's optimizer; refused where it cannot be", () => {
    const S = structLayout('State').at
    const account = (json: string, innerSteps: number) => {
      const b = Buffer.alloc(STATE_SIZE)
      b.writeBigUInt64LE(MAGICS.MAGIC[0], S.magic.offset)
      b.writeBigUInt64LE(MAGICS.LAYOUT_VERSION[0], S.version.offset)
      b.writeBigUInt64LE(BigInt(innerSteps), S.inner_steps.offset)
      b.writeBigUInt64LE(BigInt(Buffer.byteLength(json)), S.model_json_len.offset)
      b.write(json, S.model_json.offset)
      return b
    }
    const model = {...testModel, LLM: {...testModel.LLM, optimizer: sparseLoCo(7)}}
    // encodeUpdate takes inner_steps out of the JSON and sends it as a u64 after max_seq_len and cold_start_warmup_steps
    const update = Buffer.from(encodeUpdate(testConfig, model))
    const m = 1 + 1 + structLayout('Config').size + 1
    assert.equal(update[m], 1)
    assert.equal(update.readBigUInt64LE(m + 17), 7n)
    assert.ok(!update.toString('utf8').includes('inner_steps'))
    assert.equal(Buffer.from(encodeUpdate(testConfig, testModel)).readBigUInt64LE(m + 17), 1n, 'every other optimizer: 1')
    const {inner_steps: _, ...rest} = (sparseLoCo(7) as {SparseLoCo: SparseLoCoConfig}).SparseLoCo
    const decoded = decodeCoordinator(account(JSON.stringify({optimizer: {SparseLoCo: rest}}), 7)).state.model.LLM
    assert.deepEqual(decoded.optimizer, sparseLoCo(7))
    assert.equal(decodeCoordinator(account(JSON.stringify({optimizer: 'Dummy'}), 1)).state.model.LLM.optimizer, 'Dummy')
    assert.throws(() => decodeCoordinator(account(JSON.stringify({optimizer: 'Dummy'}), 3)), /inner_steps 3, but the model's optimizer is not SparseLoCo/)
    assert.throws(() => decodeCoordinator(account(JSON.stringify({optimizer: {SparseLoCo: {inner_steps: 2}}}), 3)), /without inner_steps/)
  })

  it("the program's bounds are the run config's (run-config.ts LIMITS, SPARSELOCO_LIMITS)", () => {
    const c = readFileSync(join(root, 'programs', 'coordinator', 'coordinator.c'), 'utf8')
    const define = (name: string) => {
      const m = new RegExp(`^#define ${name} (.+)$`, 'm').exec(c)
      assert.ok(m, `coordinator.c defines ${name}`)
      // the forms these take: 65535, 0xffffffffull, (1 << 20), (7 * 24 * 3600)
      const text = m[1].replace(/^\((.*)\)$/, '$1').replace(/ull$/, '')
      if (text.includes('<<'))
        return text
          .split('<<')
          .map(Number)
          .reduce((a, b) => a * 2 ** b)
      return text
        .split('*')
        .map(Number)
        .reduce((a, b) => a * b)
    }
    assert.equal(define('LIMIT_SECONDS'), LIMITS.seconds)
    assert.equal(define('LIMIT_BATCH'), LIMITS.batch)
    assert.equal(define('LIMIT_STEPS'), LIMITS.steps)
    assert.equal(define('LIMIT_SEQ_LEN'), LIMITS.seqLen)
    assert.equal(define('LIMIT_INNER_STEPS'), SPARSELOCO_LIMITS.innerSteps)
  })

  it('instruction tags and error codes come from the table', () => {
    assert.deepEqual(IX, enumValues('Instruction'))
    assert.equal(PROGRAM_ERRORS[103], 'CapacityExceeded')
    assert.equal(Object.keys(PROGRAM_ERRORS).length, Object.keys(enumValues('Error')).length)
  })

  it('validate-config knows every config field the account holds, and refuses others', async () => {
    const run = await loadRunConfigFile(join(root, 'test', 'fixtures', 'psyche-configs', 'test', 'state.toml'))
    const config = run.config as unknown as Record<string, number>
    assert.ok(CONFIG_FIELDS.every((f) => f === 'rounds_per_epoch' || f === 'max_trainers_per_round' || config[f] !== undefined))
    const full = Object.fromEntries(CONFIG_FIELDS.filter((f) => config[f] !== undefined).map((f) => [f, config[f]]))
    const ok = validateRunConfig(full, run.model)
    assert.ok('config' in ok, JSON.stringify(ok))
    const extra = validateRunConfig({...full, not_a_field: 1}, run.model)
    assert.ok('issues' in extra && extra.issues.some((i) => i.path === 'config.not_a_field'))
  })

  it('a run id is at most RUN_ID_MAX bytes in a run config file too (one rule for files, the wire and the program)', async () => {
    const text = readFileSync(join(root, 'test', 'fixtures', 'psyche-configs', 'test', 'state.toml'), 'utf8')
    const withId = (id: string) => `run_id = ${JSON.stringify(id)}\n${text.replace(/^run_id = .*$/m, '')}`
    assert.equal(parseRunConfig(withId('r'.repeat(RUN_ID_MAX)), 'state.toml').run_id, 'r'.repeat(RUN_ID_MAX))
    assert.throws(() => parseRunConfig(withId('r'.repeat(RUN_ID_MAX + 1)), 'state.toml'), /run_id/)
  })
})
