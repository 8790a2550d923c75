import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {KNOWN_SYSCALLS, LinkError, MM_PROGRAM_START, R_BPF_64_32, inspectSharedObject, link, murmur3} from '../../programs/tools/sbpf-link.js'
import {LocalChain} from '../../src/core/backend/solana/local-chain.js'
import {projectRoot} from '../../src/core/worker/python.js'
// @ts-expect-error plain ES module without types
import {PROGRAMS, programInputsHash} from '../../scripts/program-inputs.mjs'
import {keypair} from './harness.js'

const fixture = (name: string) => readFileSync(join(projectRoot, 'test', 'fixtures', 'sbpf', name))

describe('sbpf-link', () => {
  it("murmur3_32 gives the runtime's syscall keys", () => {
    // Keys from the Solana C SDK headers (static syscall hashes) and the murmur3 reference vectors.
    assert.equal(murmur3(''), 0)
    assert.equal(murmur3('', 1), 0x514e28b7)
    assert.equal(murmur3('abort'), 0xb6fc1a11)
    assert.equal(murmur3('sol_panic_'), 0x686093bb)
    assert.equal(murmur3('sol_log_'), 0x207559bd)
    assert.equal(murmur3('sol_log_64_'), 0x5c2a3178)
    assert.equal(murmur3('sol_log_pubkey'), 0x7ef088ca)
    assert.equal(murmur3('sol_sha256'), 0x11f49d86)
    assert.equal(murmur3('sol_invoke_signed_c'), 0xa22b9c85)
    assert.equal(murmur3('sol_memcpy_'), 0x717cc4a3)
    assert.equal(murmur3('sol_try_find_program_address'), 0x48504a38)
  })

  it('lays out an sBPF v0 shared object: offset = address, dynamic symbols, one R_BPF_64_32 per syscall call', () => {
    const {so, syscalls, entry} = link(fixture('hello.o'), {file: 'hello.o'})
    const elf = inspectSharedObject(so)
    assert.equal(elf.type, 3) // ET_DYN
    assert.equal(elf.machine, 247) // EM_BPF
    assert.equal(elf.flags, 0) // sBPF v0
    const text = elf.sections.find((s) => s.name === '.text')!
    const rodata = elf.sections.find((s) => s.name === '.rodata')!
    for (const s of elf.sections.filter((x) => x.flags & 2)) assert.equal(s.addr, s.offset, `${s.name}: address ≠ offset`)
    assert.equal(elf.entry, entry)
    assert.ok(elf.entry >= text.addr && elf.entry < text.addr + text.size)
    assert.deepEqual(syscalls.map((s) => s.name).sort(), ['sol_log_', 'sol_log_64_'])
    assert.deepEqual(
      elf.dynamicSymbols.map((s) => s.name),
      ['', 'entrypoint', ...syscalls.map((s) => s.name)],
    )
    assert.equal(elf.relocations.length, 2)
    for (const r of elf.relocations) {
      assert.equal(r.type, R_BPF_64_32)
      assert.ok(r.offset >= text.offset && r.offset < text.offset + text.size)
      assert.equal(so[r.offset], 0x85, 'relocation on a call')
      assert.equal(so.readInt32LE(r.offset + 4), -1, 'syscall calls carry -1 until the loader writes the key')
    }
    // Every lddw points into the mapped read-only data; the pointer table holds absolute addresses.
    let lddw = 0
    for (let o = text.offset; o < text.offset + text.size; o += 8) {
      if (so[o] === 0x18) {
        const address = BigInt(so.readUInt32LE(o + 4)) | (BigInt(so.readUInt32LE(o + 12)) << 32n)
        assert.ok(address >= MM_PROGRAM_START + BigInt(rodata.addr) && address < MM_PROGRAM_START + BigInt(rodata.addr + rodata.size))
        lddw++
        o += 8
      }
      if (so[o] === 0x85) assert.equal(so[o + 1], 0, 'no pseudo-call register marker')
    }
    assert.equal(lddw, 1)
    const first = so.readBigUInt64LE(rodata.offset) - MM_PROGRAM_START
    assert.equal(so.toString('utf8', Number(first), Number(first) + 17), 'hello from psyche')
  })

  it('the linked object runs in the Solana runtime (LiteSVM): syscalls resolve, read-only data and calls work', async () => {
    const programId = (await keypair('fixture-program')).address
    const chain = new LocalChain(programId, link(fixture('hello.o')).so)
    const payer = await keypair('fixture-payer')
    chain.airdrop(payer.address)
    const run = (byte: number) => chain.send(payer, [{programAddress: programId, accounts: [], data: Uint8Array.from([byte])}])
    const a = await run(0)
    assert.ok(a.ok, a.error)
    assert.ok(a.logs.includes('Program log: hello from psyche'), a.logs.join('\n'))
    const b = await run(1)
    assert.ok(b.logs.includes('Program log: second greeting'), b.logs.join('\n'))
    assert.ok(
      b.logs.some((l) => l.includes('0x1, 0xf')),
      b.logs.join('\n'),
    ) // sol_log_64_(which, length)
    const c = await run(7)
    assert.equal(c.code, 7)
  })

  it('refuses calls to unknown functions, naming them', () => {
    assert.throws(
      () => link(fixture('unknown-syscall.o'), {file: 'unknown-syscall.o'}),
      (e: unknown) => e instanceof LinkError && /unknown-syscall\.o: call to unknown function "printf"/.test(e.message),
    )
    assert.ok(!KNOWN_SYSCALLS.includes('printf'))
  })

  it('refuses writable data (mutable globals)', () => {
    assert.throws(
      () => link(fixture('writable.o'), {file: 'writable.o'}),
      (e: unknown) => e instanceof LinkError && /section \.data is writable data/.test(e.message),
    )
  })

  it('moves the callx register into the immediate field, and refuses JMP32', () => {
    const object = Buffer.from(fixture('hello.o'))
    // The fixture's first instruction (r2 = *(u64 *)(r1 + 8)) at .text offset 0x40 in the object.
    const textOffset = object.indexOf(Buffer.from([0x79, 0x12, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00]))
    assert.ok(textOffset > 0)
    const callx = Buffer.from(object)
    callx.set([0x8d, 0x03, 0, 0, 0, 0, 0, 0], textOffset) // callx r3 (register in dst, LLVM's encoding)
    const {so} = link(callx)
    const text = inspectSharedObject(so).sections.find((s) => s.name === '.text')!
    assert.deepEqual([...so.subarray(text.offset, text.offset + 8)], [0x8d, 0, 0, 0, 3, 0, 0, 0])
    const jmp32 = Buffer.from(object)
    jmp32.set([0x16, 0x02, 0x01, 0, 0, 0, 0, 0], textOffset)
    assert.throws(() => link(jmp32), /JMP32 .* -mcpu=v2/)
  })

  it('refuses input that is not a relocatable eBPF object', () => {
    assert.throws(() => link(Buffer.from('not an elf')), /not an ELF file/)
    const so = link(fixture('hello.o')).so
    assert.throws(() => link(so), /not a relocatable object/)
  })

  it('the committed programs were built from the committed sources (else: npm run build:programs)', () => {
    for (const program of PROGRAMS as {name: string}[]) {
      const recorded = readFileSync(join(projectRoot, 'programs', 'build', `${program.name}.inputs`), 'utf8').trim()
      assert.equal(recorded, programInputsHash(projectRoot, program), `${program.name}.so is stale`)
    }
  })
})
