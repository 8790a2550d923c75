import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {KNOWN_SYSCALLS, LinkError, MM_BYTECODE_START, MM_PROGRAM_START, R_BPF_64_32, inspectSharedObject, link, murmur3} from '../../programs/tools/sbpf-link.js'
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
    const {so, syscalls, entry} = link(fixture('hello.o'), {file: 'hello.o', version: 'v0'})
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

  it('the linked v0 object runs in the Solana runtime (LiteSVM): syscalls resolve, read-only data and calls work', async () => {
    const programId = (await keypair('fixture-program')).address
    const chain = new LocalChain(programId, link(fixture('hello.o'), {version: 'v0'}).so)
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

  /** The fixture with its first instruction (r2 = *(u64 *)(r1 + 8)) replaced. */
  const withFirst = (insn: number[]): Buffer => {
    const object = Buffer.from(fixture('hello.o'))
    const textOffset = object.indexOf(Buffer.from([0x79, 0x12, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00]))
    assert.ok(textOffset > 0)
    object.set(insn, textOffset)
    return object
  }
  const firstV3 = (so: Buffer): number[] => {
    const text = inspectSharedObject(so).programHeaders[1]
    return [...so.subarray(text.offset, text.offset + 8)]
  }

  it('moves the callx register into the immediate field (v0) or keeps it in the destination field (v3)', () => {
    const callx = withFirst([0x8d, 0x03, 0, 0, 0, 0, 0, 0]) // callx r3 (register in dst, LLVM's encoding)
    const {so} = link(callx, {version: 'v0'})
    const text = inspectSharedObject(so).sections.find((s) => s.name === '.text')!
    assert.deepEqual([...so.subarray(text.offset, text.offset + 8)], [0x8d, 0, 0, 0, 3, 0, 0, 0])
    assert.deepEqual(firstV3(link(callx).so), [0x8d, 0x03, 0, 0, 0, 0, 0, 0])
  })

  it('refuses JMP32 for v0 and keeps it for v3 (SIMD-0377), where it runs as in eBPF', () => {
    const jmp32 = withFirst([0x16, 0x02, 0x01, 0, 0, 0, 0, 0]) // if w2 == 0 goto +1
    assert.throws(() => link(jmp32, {version: 'v0'}), /JMP32 .* do not exist in sBPF v0/)
    assert.deepEqual(firstV3(link(jmp32).so), [0x16, 0x02, 0x01, 0, 0, 0, 0, 0])
    assert.throws(() => link(withFirst([0x06, 0, 0, 0, 5, 0, 0, 0])), /JMP32 instruction \(long jump/) // gotol (cpu v4)
  })

  it('refuses, for both versions, every instruction sBPF runs differently from eBPF', () => {
    const cases: [number[], RegExp][] = [
      [[0x04, 0x02, 0, 0, 1, 0, 0, 0], /32-bit add, sub and mul sign-extend their result/], // w2 += 1
      [[0x1c, 0x32, 0, 0, 0, 0, 0, 0], /32-bit add, sub and mul sign-extend/], // w2 -= w3
      [[0x24, 0x02, 0, 0, 3, 0, 0, 0], /32-bit add, sub and mul sign-extend/], // w2 *= 3
      [[0x3f, 0x32, 1, 0, 0, 0, 0, 0], /signed division/], // r2 s/= r3 (cpu v4: offset 1)
      [[0xbf, 0x32, 8, 0, 0, 0, 0, 0], /sign-extending moves/], // r2 = (s8)r3
      [[0xd7, 0x02, 0, 0, 16, 0, 0, 0], /byte swaps/], // bswap16 r2
      [[0x91, 0x12, 8, 0, 0, 0, 0, 0], /sign-extending loads/], // r2 = *(s8 *)(r1 + 8)
      [[0xdb, 0x12, 0, 0, 0, 0, 0, 0], /atomic/], // lock *(u64 *)(r2 + 0) += r1
      [[0x20, 0, 0, 0, 0, 0, 0, 0], /legacy packet loads/],
      [[0x37, 0x02, 0, 0, 0, 0, 0, 0], /division by a zero immediate/],
      [[0x67, 0x02, 0, 0, 64, 0, 0, 0], /shift by 64/],
      [[0x0d, 0x02, 0, 0, 0, 0, 0, 0], /indirect jumps/], // gotox r2
    ]
    for (const version of ['v0', 'v3'] as const)
      for (const [insn, why] of cases) assert.throws(() => link(withFirst(insn), {version}), why, `${version}: ${insn.map((b) => b.toString(16)).join(' ')}`)
    // what runs the same stays: 32-bit or/and/xor/shifts/mov zero-extend in both, as in eBPF
    for (const insn of [
      [0x44, 0x02, 0, 0, 1, 0, 0, 0],
      [0xbc, 0x32, 0, 0, 0, 0, 0, 0],
      [0x74, 0x02, 0, 0, 3, 0, 0, 0],
    ]) {
      assert.deepEqual(firstV3(link(withFirst(insn)).so), insn)
      link(withFirst(insn), {version: 'v0'})
    }
  })

  it('lays out an sBPF v3 ELF as the strict parser wants: two segments, static syscalls, final addresses', () => {
    const {so, syscalls, entry, rodataSize} = link(fixture('hello.o'), {file: 'hello.o'})
    const elf = inspectSharedObject(so)
    assert.equal(elf.type, 3) // ET_DYN
    assert.equal(elf.machine, 247)
    assert.equal(elf.flags, 3) // sBPF v3
    assert.equal(so.readBigUInt64LE(32), 64n) // program headers right after the ELF header
    assert.equal(elf.sections.length, 0)
    assert.deepEqual(elf.relocations, [])
    const [ro, text] = elf.programHeaders
    assert.equal(elf.programHeaders.length, 2)
    assert.deepEqual([ro.type, ro.flags, ro.offset, ro.vaddr, ro.paddr], [1, 4, 64 + 2 * 56, 0n, 0n]) // PT_LOAD PF_R at 0
    assert.deepEqual([text.type, text.flags, text.offset, text.vaddr, text.paddr], [1, 1, ro.offset + ro.filesz, MM_BYTECODE_START, MM_BYTECODE_START])
    for (const p of [ro, text]) {
      assert.equal(p.filesz, p.memsz)
      assert.equal(p.filesz % 8, 0)
      assert.equal(p.offset % 8, 0)
    }
    assert.equal(text.offset + text.filesz, so.length)
    assert.equal(ro.filesz, rodataSize)
    assert.equal(BigInt(entry), BigInt(elf.entry))
    assert.ok(BigInt(entry) >= MM_BYTECODE_START && BigInt(entry) < MM_BYTECODE_START + BigInt(text.filesz) && entry % 8 === 0)
    assert.deepEqual([...so.subarray(ro.offset, ro.offset + 8)], [0, 0, 0, 0, 0, 0, 0, 0], 'no object at address 0')
    const calls: number[] = []
    let lddw = 0
    let internal = 0
    for (let o = text.offset; o < text.offset + text.filesz; o += 8) {
      if (so[o] === 0x18) {
        const address = BigInt(so.readUInt32LE(o + 4)) | (BigInt(so.readUInt32LE(o + 12)) << 32n)
        assert.ok(address >= 8n && address < BigInt(ro.filesz), `lddw address ${address} is in read-only data`)
        // the pointer table: absolute addresses of the strings, in read-only data too
        const first = Number(so.readBigUInt64LE(ro.offset + Number(address)))
        assert.ok(first >= 8 && first < ro.filesz)
        assert.equal(so.toString('utf8', ro.offset + first, ro.offset + first + 17), 'hello from psyche')
        lddw++
        o += 8
      } else if (so[o] === 0x85) {
        const src = so[o + 1] >> 4
        if (src === 0)
          calls.push(so.readUInt32LE(o + 4)) // a static syscall: its key
        else {
          // a call of our own: src 1, pc-relative, onto an instruction of the bytecode
          assert.equal(src, 1)
          const target = (o - text.offset) / 8 + 1 + so.readInt32LE(o + 4)
          assert.ok(target >= 0 && target < text.filesz / 8)
          internal++
        }
      }
    }
    assert.equal(lddw, 1)
    assert.ok(internal > 0, 'the fixture calls a function of its own')
    assert.deepEqual([...new Set(calls)].sort(), syscalls.map((s) => s.hash).sort())
    assert.deepEqual(syscalls.map((s) => s.name).sort(), ['sol_log_', 'sol_log_64_'])
  })

  it('the linked v3 object deploys through the loader with SIMD-0500 active, and runs', async () => {
    const programId = (await keypair('fixture-program-v3')).address
    const chain = new LocalChain(programId, null)
    await chain.deploy(programId, link(fixture('hello.o')).so)
    const payer = await keypair('fixture-payer')
    chain.airdrop(payer.address)
    const run = (byte: number) => chain.send(payer, [{programAddress: programId, accounts: [], data: Uint8Array.from([byte])}])
    const a = await run(0)
    assert.ok(a.ok, a.error)
    assert.ok(a.logs.includes('Program log: hello from psyche'), a.logs.join('\n'))
    const b = await run(1)
    assert.ok(b.logs.includes('Program log: second greeting') && b.logs.some((l) => l.includes('0x1, 0xf')), b.logs.join('\n'))
    assert.equal((await run(7)).code, 7)
  })

  it('refuses input that is not a relocatable eBPF object', () => {
    assert.throws(() => link(Buffer.from('not an elf')), /not an ELF file/)
    for (const version of ['v0', 'v3'] as const) assert.throws(() => link(link(fixture('hello.o'), {version}).so), /not a relocatable object/)
    assert.throws(() => link(fixture('hello.o'), {version: 'v2' as 'v3'}), /sBPF version "v2": expected v0 or v3/)
  })

  it('the committed programs were built from the committed sources (else: npm run build:programs)', () => {
    for (const program of PROGRAMS as {name: string}[]) {
      const recorded = readFileSync(join(projectRoot, 'programs', 'build', `${program.name}.inputs`), 'utf8').trim()
      assert.equal(recorded, programInputsHash(projectRoot, program), `${program.name}.so is stale`)
    }
  })
})
