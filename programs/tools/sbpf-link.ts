import {readFileSync, renameSync, writeFileSync} from 'node:fs'

/**
 * The post-link step of the program build: turns one relocatable eBPF object (clang `-target bpf
 * -mcpu=v2 -c`, or `llc -march=bpfel -filetype=obj`) into the sBPF shared object the Solana loader
 * accepts: v3 by default (what a current cluster deploys), v0 for clusters without v3. No available linker writes
 * these formats (lld: "unsupported e_machine 247"; bpf-ld: "-shared not supported"), so this is the linker.
 *
 * sBPF v3 (SIMD-0178, SIMD-0189, SIMD-0377; solana-sbpf's strict ELF parser):
 *
 *   ELF header (e_flags 3) · 2 program headers · read-only data (PT_LOAD PF_R, address 0) · bytecode (PT_LOAD PF_X,
 *   address MM_BYTECODE_START = 0x1_0000_0000)
 *
 *   Each segment's file offset follows the previous one's end, its file and memory sizes are equal and a multiple of 8;
 *   e_entry is the entry function's address. No dynamic section, symbols, relocations or section headers: syscalls
 *   are static (`call` with src 0 and the murmur3 key of the name as its immediate), calls between our functions
 *   keep eBPF's encoding (src 1, pc-relative immediate), `lddw` and pointers in read-only data carry final addresses
 *   (read-only data from 0, after 8 bytes of padding so that no object's address is 0, i.e. NULL; code from
 *   MM_BYTECODE_START), and `callx` names its register in the destination field.
 *
 * sBPF v0 (every allocated section at file offset = virtual address, as the v0 loader maps the file from
 * MM_PROGRAM_START = 0x1_0000_0000):
 *
 *   ELF header · program headers · .text · .rodata · .dynamic · .dynsym · .dynstr · .rel.dyn · .shstrtab · section headers
 *
 *   Calls between our functions become pc-relative `call imm` (the loader registers their targets); a call to a
 *   syscall gets a dynamic symbol and an R_BPF_64_32 relocation (imm -1; the loader writes murmur3(name));
 *   `lddw` of read-only data gets MM_PROGRAM_START + address; `callx` carries its register in the immediate field.
 *
 * Both: a call to an undefined symbol must name a known syscall (refused here rather than at deploy time); writable
 * data (.data, .bss: mutable globals) is refused; and so is every instruction the target version lacks or runs
 * differently from eBPF, which clang compiled for (checkInstructions): 32-bit add, sub and mul (sBPF sign-extends
 * their results, eBPF zero-extends), cpu v4's signed division, sign-extending moves and loads, byte swaps and long
 * jumps, atomics, legacy packet loads, and JMP32 in v0.
 */

export const MM_PROGRAM_START = 0x1_0000_0000n

/** murmur3_32 (seed 0) of a symbol name: how the runtime keys syscalls and functions. */
export function murmur3(data: Uint8Array | string, seed = 0): number {
  const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data
  let h = seed >>> 0
  const c1 = 0xcc9e2d51
  const c2 = 0x1b873593
  const blocks = bytes.length >> 2
  for (let i = 0; i < blocks; i++) {
    let k = bytes[4 * i] | (bytes[4 * i + 1] << 8) | (bytes[4 * i + 2] << 16) | (bytes[4 * i + 3] << 24)
    k = Math.imul(k, c1)
    k = (k << 15) | (k >>> 17)
    k = Math.imul(k, c2)
    h ^= k
    h = (h << 13) | (h >>> 19)
    h = (Math.imul(h, 5) + 0xe6546b64) | 0
  }
  let k = 0
  const tail = blocks * 4
  switch (bytes.length & 3) {
    case 3:
      k ^= bytes[tail + 2] << 16
    // fall through
    case 2:
      k ^= bytes[tail + 1] << 8
    // fall through
    case 1:
      k ^= bytes[tail]
      k = Math.imul(k, c1)
      k = (k << 15) | (k >>> 17)
      k = Math.imul(k, c2)
      h ^= k
  }
  h ^= bytes.length
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

/** Syscalls of the Solana runtime that sBPF v0 programs may call (agave's legacy syscall registry). */
export const KNOWN_SYSCALLS: readonly string[] = [
  'abort',
  'sol_panic_',
  'sol_log_',
  'sol_log_64_',
  'sol_log_compute_units_',
  'sol_log_pubkey',
  'sol_log_data',
  'sol_create_program_address',
  'sol_try_find_program_address',
  'sol_sha256',
  'sol_keccak256',
  'sol_blake3',
  'sol_secp256k1_recover',
  'sol_poseidon',
  'sol_get_clock_sysvar',
  'sol_get_epoch_schedule_sysvar',
  'sol_get_rent_sysvar',
  'sol_get_last_restart_slot',
  'sol_get_epoch_rewards_sysvar',
  'sol_get_sysvar',
  'sol_memcpy_',
  'sol_memmove_',
  'sol_memcmp_',
  'sol_memset_',
  'sol_invoke_signed_c',
  'sol_invoke_signed_rust',
  'sol_set_return_data',
  'sol_get_return_data',
  'sol_get_stack_height',
  'sol_get_processed_sibling_instruction',
  'sol_remaining_compute_units',
  'sol_curve_validate_point',
  'sol_curve_group_op',
  'sol_curve_multiscalar_mul',
  'sol_alt_bn128_group_op',
  'sol_alt_bn128_compression',
  'sol_big_mod_exp',
  'sol_get_epoch_stake',
]

export class LinkError extends Error {}

// ---- ELF constants ----
const ET_REL = 1
const ET_DYN = 3
const EM_BPF = 247
const SHT_PROGBITS = 1
const SHT_SYMTAB = 2
const SHT_STRTAB = 3
const SHT_NOBITS = 8
const SHT_REL = 9
const SHT_DYNSYM = 11
const SHT_DYNAMIC = 6
const SHF_WRITE = 1
const SHF_ALLOC = 2
const SHF_EXECINSTR = 4
const STT_SECTION = 3
const STT_FUNC = 2
const STB_GLOBAL = 1
const PT_LOAD = 1
const PT_DYNAMIC = 2
const PF_X = 1
const PF_R = 4
const DT_NULL = 0
const DT_STRTAB = 5
const DT_SYMTAB = 6
const DT_STRSZ = 10
const DT_SYMENT = 11
const DT_REL = 17
const DT_RELSZ = 18
const DT_RELENT = 19
const DT_TEXTREL = 22
export const R_BPF_64_64 = 1
export const R_BPF_64_ABS64 = 2
export const R_BPF_64_32 = 10

interface Section {
  index: number
  name: string
  type: number
  flags: bigint
  offset: number
  size: number
  link: number
  info: number
  align: number
  entsize: number
}

interface Symbol {
  name: string
  value: number
  size: number
  type: number
  bind: number
  shndx: number
}

interface Rel {
  offset: number
  sym: number
  type: number
}

function parseObject(bytes: Buffer, file: string): {sections: Section[]; symbols: Symbol[]; rels: Map<number, Rel[]>} {
  const fail = (why: string): never => {
    throw new LinkError(`${file}: ${why}`)
  }
  if (bytes.length < 64 || bytes.readUInt32BE(0) !== 0x7f454c46) fail('not an ELF file')
  if (bytes[4] !== 2 || bytes[5] !== 1) fail('not a 64-bit little-endian ELF (compile for bpfel)')
  if (bytes.readUInt16LE(16) !== ET_REL) fail('not a relocatable object (pass the .o from clang -c / llc -filetype=obj)')
  if (bytes.readUInt16LE(18) !== EM_BPF) fail(`e_machine ${bytes.readUInt16LE(18)} is not BPF (247)`)
  const shoff = Number(bytes.readBigUInt64LE(40))
  const shentsize = bytes.readUInt16LE(58)
  const shnum = bytes.readUInt16LE(60)
  const shstrndx = bytes.readUInt16LE(62)
  if (shentsize !== 64 || shoff + shnum * 64 > bytes.length || shstrndx >= shnum) fail('corrupt section header table')
  const raw: (Omit<Section, 'name'> & {nameOff: number})[] = []
  for (let i = 0; i < shnum; i++) {
    const o = shoff + i * 64
    const s = {
      index: i,
      nameOff: bytes.readUInt32LE(o),
      type: bytes.readUInt32LE(o + 4),
      flags: bytes.readBigUInt64LE(o + 8),
      offset: Number(bytes.readBigUInt64LE(o + 24)),
      size: Number(bytes.readBigUInt64LE(o + 32)),
      link: bytes.readUInt32LE(o + 40),
      info: bytes.readUInt32LE(o + 44),
      align: Number(bytes.readBigUInt64LE(o + 48)),
      entsize: Number(bytes.readBigUInt64LE(o + 56)),
    }
    if (s.type !== SHT_NOBITS && s.offset + s.size > bytes.length) fail(`section ${i} lies outside the file`)
    raw.push(s)
  }
  const cstr = (base: number, limit: number, off: number): string => {
    if (off >= limit) fail(`string offset ${off} outside its table`)
    let end = base + off
    while (end < base + limit && bytes[end] !== 0) end++
    return bytes.toString('utf8', base + off, end)
  }
  const shstr = raw[shstrndx]
  const sections: Section[] = raw.map(({nameOff, ...s}) => ({...s, name: cstr(shstr.offset, shstr.size, nameOff)}))
  const symtab = sections.find((s) => s.type === SHT_SYMTAB) ?? fail('no symbol table')
  const strtab = sections[symtab.link] ?? fail('symbol table has no string table')
  const symbols: Symbol[] = []
  for (let o = symtab.offset; o + 24 <= symtab.offset + symtab.size; o += 24) {
    const info = bytes[o + 4]
    symbols.push({
      name: cstr(strtab.offset, strtab.size, bytes.readUInt32LE(o)),
      type: info & 15,
      bind: info >> 4,
      shndx: bytes.readUInt16LE(o + 6),
      value: Number(bytes.readBigUInt64LE(o + 8)),
      size: Number(bytes.readBigUInt64LE(o + 16)),
    })
  }
  const rels = new Map<number, Rel[]>()
  for (const s of sections) {
    if (s.type !== SHT_REL) continue
    if (s.entsize !== 16) fail(`relocation section ${s.name} has entries of ${s.entsize} bytes, expected 16`)
    const list: Rel[] = []
    for (let o = s.offset; o + 16 <= s.offset + s.size; o += 16) {
      const info = bytes.readBigUInt64LE(o + 8)
      list.push({offset: Number(bytes.readBigUInt64LE(o)), sym: Number(info >> 32n), type: Number(info & 0xffffffffn)})
    }
    rels.set(s.info, list)
  }
  return {sections, symbols, rels}
}

const align = (n: number, a: number): number => (a > 1 ? Math.ceil(n / a) * a : n)

/**
 * The sBPF version to emit. v3 (SIMD-0178 static syscalls, SIMD-0189 stricter ELF headers, SIMD-0377 JMP32) is what a
 * current cluster deploys: SIMD-0500 refuses to deploy v0, v1 and v2. v0 is for clusters without v3 (and for loading
 * at genesis where v3 is not enabled yet).
 */
export type SbpfVersion = 'v0' | 'v3'

/** Where v3 maps the bytecode; read-only data starts at address 0 (MM_RODATA_START). */
export const MM_BYTECODE_START = 0x1_0000_0000n
/** v3: the first bytes of read-only data are padding, so that no object has address 0 (which C reads as NULL). */
const V3_RODATA_PAD = 8

export interface LinkResult {
  /** The shared object. */
  so: Buffer
  version: SbpfVersion
  /** Syscalls the program calls, with their murmur3 keys. */
  syscalls: {name: string; hash: number}[]
  textSize: number
  rodataSize: number
  /** The entrypoint's file offset (v0) or virtual address (v3), as e_entry holds it. */
  entry: number
}

/**
 * Links one relocatable eBPF object into an sBPF shared object (`version`, default v3). `entrypoint` names the entry
 * function. Refuses what the target version lacks or would run differently from the eBPF clang compiled for.
 */
export function link(object: Uint8Array, options: {file?: string; entrypoint?: string; version?: SbpfVersion} = {}): LinkResult {
  const file = options.file ?? 'object'
  const entryName = options.entrypoint ?? 'entrypoint'
  const version = options.version ?? 'v3'
  if (version !== 'v0' && version !== 'v3') throw new LinkError(`${file}: sBPF version ${JSON.stringify(version)}: expected v0 or v3`)
  const v3 = version === 'v3'
  const bytes = Buffer.from(object.buffer, object.byteOffset, object.byteLength)
  const {sections, symbols, rels} = parseObject(bytes, file)
  const fail = (why: string): never => {
    throw new LinkError(`${file}: ${why}`)
  }

  // Sort the allocated sections into code and read-only data; refuse writable data.
  const code: Section[] = []
  const rodata: Section[] = []
  for (const s of sections) {
    if (!(s.flags & BigInt(SHF_ALLOC)) || s.size === 0) continue
    if (s.flags & BigInt(SHF_WRITE)) fail(`section ${s.name} is writable data (a mutable global or static): sBPF programs cannot have any; make it const or keep it in an account`)
    if (s.type === SHT_NOBITS) fail(`section ${s.name} is zero-initialized data (.bss): sBPF programs cannot have any`)
    if (s.flags & BigInt(SHF_EXECINSTR)) code.push(s)
    else if (s.type === SHT_PROGBITS) rodata.push(s)
  }
  if (code.length === 0) fail('no code: the object has no executable section')

  // Layout. v0: headers, .text, .rodata, each at file offset = address (the loader maps the file from
  // MM_PROGRAM_START). v3: headers, then the read-only segment (address 0), then the bytecode segment (MM_BYTECODE_START).
  const PHNUM = v3 ? 2 : 4
  const headersEnd = 64 + PHNUM * 56
  const textOf = new Map<number, number>() // code section index -> offset in .text
  const roOf = new Map<number, number>() // rodata section index -> offset in the read-only segment
  let textSize = 0
  for (const s of code) {
    if (s.size % 8) fail(`code section ${s.name} is not a whole number of instructions`)
    textSize = align(textSize, 8)
    textOf.set(s.index, textSize)
    textSize += s.size
  }
  let textStart: number
  let rodataStart: number
  let roSize: number
  if (v3) {
    // Aligned by address (= offset in the segment); the segment's size is a whole number of instructions.
    let cursor = V3_RODATA_PAD
    for (const s of rodata) {
      cursor = align(cursor, Math.max(1, s.align))
      roOf.set(s.index, cursor)
      cursor += s.size
    }
    roSize = align(cursor, 8)
    rodataStart = headersEnd
    textStart = rodataStart + roSize
  } else {
    textStart = align(headersEnd, 8)
    rodataStart = align(textStart + textSize, 8)
    let cursor = rodataStart // aligned by file offset (= address - MM_PROGRAM_START)
    for (const s of rodata) {
      cursor = align(cursor, Math.max(1, s.align))
      roOf.set(s.index, cursor - rodataStart)
      cursor += s.size
    }
    roSize = cursor - rodataStart
  }
  /** Virtual addresses the program sees. */
  const codeAddress = (textOffset: number): bigint => (v3 ? MM_BYTECODE_START : MM_PROGRAM_START + BigInt(textStart)) + BigInt(textOffset)
  const roAddress = (roOffset: number): bigint => (v3 ? 0n : MM_PROGRAM_START + BigInt(rodataStart)) + BigInt(roOffset)

  const text = Buffer.alloc(textSize)
  for (const s of code) bytes.copy(text, textOf.get(s.index)!, s.offset, s.offset + s.size)
  const ro = Buffer.alloc(roSize)
  for (const s of rodata) bytes.copy(ro, roOf.get(s.index)!, s.offset, s.offset + s.size)

  const symbolAddress = (sym: Symbol, what: string): bigint => {
    const t = textOf.get(sym.shndx)
    if (t !== undefined) return codeAddress(t + sym.value)
    const r = roOf.get(sym.shndx)
    if (r !== undefined) return roAddress(r + sym.value)
    return fail(`${what}: symbol ${JSON.stringify(sym.name || `section ${sym.shndx}`)} is not in code or read-only data`)
  }

  const syscalls: string[] = []
  const dynRels: {offset: number; name: string}[] = [] // v0: file offsets of syscall calls
  const codeRels = new Set<number>() // .text offsets of instructions a relocation fixed

  for (const [target, list] of rels) {
    const targetSection = sections[target]
    if (!targetSection || !(targetSection.flags & BigInt(SHF_ALLOC))) continue // debug info (.BTF.ext ...)
    const intoText = textOf.get(target)
    const intoRo = roOf.get(target)
    if (intoText === undefined && intoRo === undefined) continue // empty section
    for (const r of list) {
      const sym = symbols[r.sym] ?? fail(`relocation names symbol ${r.sym}, which does not exist`)
      if (intoText !== undefined) {
        const o = intoText + r.offset
        if (o % 8 || o + 8 > text.length) fail(`relocation at ${r.offset} in ${targetSection.name} is not on an instruction`)
        const opcode = text[o]
        if (r.type === R_BPF_64_64) {
          if (opcode !== 0x18 || o + 16 > text.length) fail(`R_BPF_64_64 at ${r.offset} is not on a lddw`)
          const address = symbolAddress(sym, 'lddw') + BigInt(text.readInt32LE(o + 4))
          text.writeUInt32LE(Number(address & 0xffffffffn), o + 4)
          text.writeUInt32LE(Number(address >> 32n), o + 12)
          codeRels.add(o)
        } else if (r.type === R_BPF_64_32) {
          if (opcode !== 0x85) fail(`R_BPF_64_32 at ${r.offset} is not on a call`)
          if (sym.shndx === 0) {
            if (!KNOWN_SYSCALLS.includes(sym.name)) fail(`call to unknown function ${JSON.stringify(sym.name)}: it is neither defined in the program nor a Solana syscall`)
            if (!syscalls.includes(sym.name)) syscalls.push(sym.name)
            if (v3) {
              // a static syscall: call with src 0 and the murmur3 key of the name
              text[o + 1] = 0
              text.writeUInt32LE(murmur3(sym.name), o + 4)
            } else {
              // the loader writes the key through the dynamic relocation
              dynRels.push({offset: textStart + o, name: sym.name})
              text[o + 1] = 0
              text.writeInt32LE(-1, o + 4)
            }
          } else {
            const base = textOf.get(sym.shndx)
            if (base === undefined) fail(`call to ${JSON.stringify(sym.name)}, which is not code`)
            const destination = sym.type === STT_SECTION ? base! + (text.readInt32LE(o + 4) + 1) * 8 : base! + sym.value
            text.writeInt32LE((destination - (o + 8)) / 8, o + 4)
            // v3: an internal call is marked by src 1 (BPF_PSEUDO_CALL, as eBPF); v0 has no marker
            text[o + 1] = v3 ? 0x10 : 0
          }
          codeRels.add(o)
        } else fail(`unsupported relocation type ${r.type} in ${targetSection.name} (to ${JSON.stringify(sym.name)})`)
      } else {
        const o = intoRo! + r.offset
        if (r.type !== R_BPF_64_ABS64) fail(`unsupported relocation type ${r.type} in read-only data ${targetSection.name}`)
        ro.writeBigUInt64LE(BigInt.asUintN(64, symbolAddress(sym, 'pointer in read-only data') + ro.readBigInt64LE(o)), o)
      }
    }
  }

  checkInstructions(text, codeRels, version, file)

  const entrySym = symbols.find((s) => s.name === entryName && s.type === STT_FUNC && s.bind === STB_GLOBAL && textOf.has(s.shndx))
  if (!entrySym) fail(`no global function ${JSON.stringify(entryName)} (the program's entrypoint)`)
  const entryText = textOf.get(entrySym!.shndx)! + entrySym!.value
  const result = {version, syscalls: syscalls.map((name) => ({name, hash: murmur3(name)})), textSize: text.length, rodataSize: ro.length}
  if (v3) {
    const entry = Number(codeAddress(entryText))
    return {...result, so: writeV3(text, ro, entry), entry}
  }
  const entry = textStart + entryText
  return {...result, so: writeV0({text, ro, textStart, rodataStart, entry, entryName, entrySize: entrySym!.size, syscalls, dynRels}), entry}
}

/**
 * Refuses every instruction the target version lacks or runs differently from eBPF (what clang compiled for), and
 * rewrites the encodings that differ (callx's register; v0's call marker). Differences that cannot be seen statically:
 * a division or remainder by a zero register aborts in sBPF (eBPF gives 0 or keeps the dividend; in C it is undefined).
 */
function checkInstructions(text: Buffer, codeRels: Set<number>, version: SbpfVersion, file: string): void {
  const v3 = version === 'v3'
  for (let o = 0; o < text.length; o += 8) {
    const op = text[o]
    const cls = op & 7
    const code = op & 0xf0
    const src = text[o + 1] >> 4
    const off = text.readInt16LE(o + 2)
    const imm = text.readInt32LE(o + 4)
    const at = `${file}: instruction ${o / 8} (opcode 0x${op.toString(16).padStart(2, '0')})`
    const refuse = (why: string): never => {
      throw new LinkError(`${at}: ${why}`)
    }
    switch (cls) {
      case 0: // LD: only lddw (two slots), of an address or a constant
        if (op !== 0x18) refuse('legacy packet loads (LD_ABS/LD_IND) do not exist in sBPF')
        if (src !== 0) refuse('lddw of a map or BTF object (pseudo source) does not exist in sBPF')
        if (o + 16 > text.length || text[o + 8] !== 0) refuse('lddw is not followed by its second slot')
        o += 8
        break
      case 1: // LDX
      case 2: // ST
      case 3: // STX
        if ((op & 0xe0) === 0x80) refuse(`sign-extending loads (BPF cpu v4) do not exist in sBPF ${version}`)
        if (cls === 3 && (op & 0xe0) === 0xc0) refuse(`atomic instructions do not exist in sBPF ${version}`)
        if ((op & 0xe0) !== 0x60) refuse(`memory access mode 0x${(op & 0xe0).toString(16)} does not exist in sBPF`)
        break
      case 4: // ALU (32-bit)
      case 7: {
        // ALU64
        if (off !== 0) refuse(`signed division, remainder or sign-extending moves (BPF cpu v4, offset ${off}) do not exist in sBPF ${version}`)
        if (cls === 4 && (code === 0x00 || code === 0x10 || code === 0x20))
          refuse(`32-bit add, sub and mul sign-extend their result in sBPF ${version}, where eBPF zero-extends: compile without alu32 (-mcpu=v2)`)
        if (cls === 7 && code === 0xd0) refuse(`unconditional byte swaps (BPF cpu v4) do not exist in sBPF ${version}`)
        if (code === 0xe0 || code === 0xf0) refuse('unknown ALU operation')
        if ((code === 0x30 || code === 0x90) && (op & 8) === 0 && imm === 0) refuse('division by a zero immediate')
        if ((code === 0x60 || code === 0x70 || code === 0xc0) && (op & 8) === 0 && (imm < 0 || imm >= (cls === 4 ? 32 : 64)))
          refuse(`shift by ${imm}, outside the register's width`)
        break
      }
      case 5: // JMP
        if (op === 0x85) {
          if (src > 1) refuse('calls to kernel functions (kfuncs) do not exist in sBPF')
          if (!codeRels.has(o)) {
            // A call the compiler resolved itself: pc-relative already. v3 keeps its BPF_PSEUDO_CALL marker, v0 drops it.
            if (src !== 1) refuse('a call that is neither to a function of the program nor a relocated syscall')
            text[o + 1] = v3 ? 0x10 : 0
          }
        } else if (op === 0x8d) {
          const dst = text[o + 1] & 15
          const reg = dst || src || imm
          if (reg < 0 || reg > 9) refuse(`callx register r${reg} is not r0..r9`)
          // v0: the register in the immediate field; v3: in the destination register field (SIMD-0377)
          text[o + 1] = v3 ? reg : 0
          text.writeInt32LE(v3 ? 0 : reg, o + 4)
        } else if (op !== 0x95 && op !== 0x05 && (code === 0x00 || code === 0x80 || code === 0x90 || code > 0xd0))
          refuse('this jump does not exist in sBPF (indirect jumps, exit with a register)')
        break
      case 6: // JMP32
        if (!v3) refuse('JMP32 instructions (BPF cpu v3) do not exist in sBPF v0; compile with -mcpu=v2 or link for v3')
        if (code === 0x00 || code === 0x80 || code === 0x90 || code > 0xd0) refuse('this JMP32 instruction (long jump, call or exit) does not exist in sBPF v3')
        break
    }
  }
}

/** The sBPF v3 ELF (SIMD-0189): the ELF header, two program headers (read-only data at 0, bytecode at MM_BYTECODE_START), the segments. */
function writeV3(text: Buffer, ro: Buffer, entry: number): Buffer {
  const headersEnd = 64 + 2 * 56
  const out = Buffer.alloc(headersEnd + ro.length + text.length)
  out.writeUInt32BE(0x7f454c46, 0)
  out[4] = 2 // 64-bit
  out[5] = 1 // little-endian
  out[6] = 1 // version
  out[7] = 0 // System V ABI, ABI version 0, padding 0
  out.writeUInt16LE(ET_DYN, 16)
  out.writeUInt16LE(EM_BPF, 18)
  out.writeUInt32LE(1, 20)
  out.writeBigUInt64LE(BigInt(entry), 24)
  out.writeBigUInt64LE(64n, 32) // e_phoff: right after the header
  out.writeBigUInt64LE(0n, 40) // no section headers: the loader reads none
  out.writeUInt32LE(3, 48) // e_flags: sBPF v3
  out.writeUInt16LE(64, 52)
  out.writeUInt16LE(56, 54)
  out.writeUInt16LE(2, 56)
  out.writeUInt16LE(64, 58)
  const phdr = (i: number, flags: number, offset: number, vaddr: bigint, size: number): void => {
    const o = 64 + i * 56
    out.writeUInt32LE(PT_LOAD, o)
    out.writeUInt32LE(flags, o + 4)
    out.writeBigUInt64LE(BigInt(offset), o + 8)
    out.writeBigUInt64LE(vaddr, o + 16)
    out.writeBigUInt64LE(vaddr, o + 24)
    out.writeBigUInt64LE(BigInt(size), o + 32)
    out.writeBigUInt64LE(BigInt(size), o + 40)
    out.writeBigUInt64LE(8n, o + 48)
  }
  phdr(0, PF_R, headersEnd, 0n, ro.length)
  phdr(1, PF_X, headersEnd + ro.length, MM_BYTECODE_START, text.length)
  ro.copy(out, headersEnd)
  text.copy(out, headersEnd + ro.length)
  return out
}

/** The sBPF v0 ELF: headers · .text · .rodata · .dynamic · .dynsym · .dynstr · .rel.dyn · .shstrtab · section headers. */
function writeV0(o: {
  text: Buffer
  ro: Buffer
  textStart: number
  rodataStart: number
  entry: number
  entryName: string
  entrySize: number
  syscalls: string[]
  dynRels: {offset: number; name: string}[]
}): Buffer {
  const {text, ro, textStart, rodataStart, entry, entryName, syscalls, dynRels} = o
  const PHNUM = 4
  const textEnd = textStart + text.length
  const rodataEnd = rodataStart + ro.length
  // Dynamic symbols: null, the entrypoint, then one per syscall.
  const dynstrParts: Buffer[] = [Buffer.from([0])]
  let dynstrSize = 1
  const addStr = (s: string): number => {
    const off = dynstrSize
    const b = Buffer.from(`${s}\0`, 'utf8')
    dynstrParts.push(b)
    dynstrSize += b.length
    return off
  }
  const dynsymEntries: {name: number; info: number; shndx: number; value: number; size: number}[] = [{name: 0, info: 0, shndx: 0, value: 0, size: 0}]
  dynsymEntries.push({name: addStr(entryName), info: (STB_GLOBAL << 4) | STT_FUNC, shndx: 1, value: entry, size: o.entrySize})
  const symIndex = new Map<string, number>()
  for (const name of syscalls) {
    symIndex.set(name, dynsymEntries.length)
    dynsymEntries.push({name: addStr(name), info: STB_GLOBAL << 4, shndx: 0, value: 0, size: 0})
  }
  const dynstr = Buffer.concat(dynstrParts)

  const DYN_COUNT = 9
  const dynamicOff = align(rodataEnd, 8)
  const dynsymOff = dynamicOff + DYN_COUNT * 16
  const dynstrOff = dynsymOff + dynsymEntries.length * 24
  const relOff = align(dynstrOff + dynstr.length, 8)
  const relEnd = relOff + dynRels.length * 16
  const shstrNames = ['', '.text', '.rodata', '.dynamic', '.dynsym', '.dynstr', '.rel.dyn', '.shstrtab']
  const shstrOffsets: number[] = []
  let shstrSize = 0
  for (const n of shstrNames) {
    shstrOffsets.push(shstrSize)
    shstrSize += Buffer.byteLength(n) + 1
  }
  const shstrOff = relEnd
  const shOff = align(shstrOff + shstrSize, 8)
  const SHNUM = shstrNames.length
  const out = Buffer.alloc(shOff + SHNUM * 64)

  // ELF header.
  out.writeUInt32BE(0x7f454c46, 0)
  out[4] = 2 // 64-bit
  out[5] = 1 // little-endian
  out[6] = 1 // version
  out[7] = 0 // System V ABI
  out.writeUInt16LE(ET_DYN, 16)
  out.writeUInt16LE(EM_BPF, 18)
  out.writeUInt32LE(1, 20)
  out.writeBigUInt64LE(BigInt(entry), 24)
  out.writeBigUInt64LE(64n, 32) // e_phoff
  out.writeBigUInt64LE(BigInt(shOff), 40)
  out.writeUInt32LE(0, 48) // e_flags 0: sBPF v0
  out.writeUInt16LE(64, 52)
  out.writeUInt16LE(56, 54)
  out.writeUInt16LE(PHNUM, 56)
  out.writeUInt16LE(64, 58)
  out.writeUInt16LE(SHNUM, 60)
  out.writeUInt16LE(SHNUM - 1, 62)

  const phdr = (i: number, type: number, flags: number, off: number, size: number, alignTo: number): void => {
    const at = 64 + i * 56
    out.writeUInt32LE(type, at)
    out.writeUInt32LE(flags, at + 4)
    out.writeBigUInt64LE(BigInt(off), at + 8)
    out.writeBigUInt64LE(BigInt(off), at + 16)
    out.writeBigUInt64LE(BigInt(off), at + 24)
    out.writeBigUInt64LE(BigInt(size), at + 32)
    out.writeBigUInt64LE(BigInt(size), at + 40)
    out.writeBigUInt64LE(BigInt(alignTo), at + 48)
  }
  phdr(0, PT_LOAD, PF_R | PF_X, textStart, textEnd - textStart, 8)
  phdr(1, PT_LOAD, PF_R, rodataStart, rodataEnd - rodataStart, 8)
  phdr(2, PT_LOAD, PF_R, dynamicOff, relEnd - dynamicOff, 8)
  phdr(3, PT_DYNAMIC, PF_R, dynamicOff, DYN_COUNT * 16, 8)

  text.copy(out, textStart)
  ro.copy(out, rodataStart)
  const dyn: [number, number][] = [
    [DT_SYMTAB, dynsymOff],
    [DT_SYMENT, 24],
    [DT_STRTAB, dynstrOff],
    [DT_STRSZ, dynstr.length],
    [DT_REL, relOff],
    [DT_RELSZ, dynRels.length * 16],
    [DT_RELENT, 16],
    [DT_TEXTREL, 0],
    [DT_NULL, 0],
  ]
  dyn.forEach(([tag, value], i) => {
    out.writeBigUInt64LE(BigInt(tag), dynamicOff + i * 16)
    out.writeBigUInt64LE(BigInt(value), dynamicOff + i * 16 + 8)
  })
  dynsymEntries.forEach((s, i) => {
    const at = dynsymOff + i * 24
    out.writeUInt32LE(s.name, at)
    out[at + 4] = s.info
    out.writeUInt16LE(s.shndx, at + 6)
    out.writeBigUInt64LE(BigInt(s.value), at + 8)
    out.writeBigUInt64LE(BigInt(s.size), at + 16)
  })
  dynstr.copy(out, dynstrOff)
  dynRels.forEach((r, i) => {
    out.writeBigUInt64LE(BigInt(r.offset), relOff + i * 16)
    out.writeBigUInt64LE((BigInt(symIndex.get(r.name)!) << 32n) | BigInt(R_BPF_64_32), relOff + i * 16 + 8)
  })
  let so = shstrOff
  for (const n of shstrNames) {
    out.write(n, so, 'utf8')
    so += Buffer.byteLength(n) + 1
  }
  const shdr = (i: number, type: number, flags: number, off: number, size: number, link: number, info: number, alignTo: number, entsize: number): void => {
    const at = shOff + i * 64
    out.writeUInt32LE(shstrOffsets[i], at)
    out.writeUInt32LE(type, at + 4)
    out.writeBigUInt64LE(BigInt(flags), at + 8)
    out.writeBigUInt64LE(BigInt(flags & SHF_ALLOC ? off : 0), at + 16)
    out.writeBigUInt64LE(BigInt(off), at + 24)
    out.writeBigUInt64LE(BigInt(size), at + 32)
    out.writeUInt32LE(link, at + 40)
    out.writeUInt32LE(info, at + 44)
    out.writeBigUInt64LE(BigInt(alignTo), at + 48)
    out.writeBigUInt64LE(BigInt(entsize), at + 56)
  }
  shdr(1, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, textStart, textEnd - textStart, 0, 0, 8, 0)
  shdr(2, SHT_PROGBITS, SHF_ALLOC, rodataStart, rodataEnd - rodataStart, 0, 0, 8, 0)
  shdr(3, SHT_DYNAMIC, SHF_ALLOC, dynamicOff, DYN_COUNT * 16, 5, 0, 8, 16)
  shdr(4, SHT_DYNSYM, SHF_ALLOC, dynsymOff, dynsymEntries.length * 24, 5, 1, 8, 24)
  shdr(5, SHT_STRTAB, SHF_ALLOC, dynstrOff, dynstr.length, 0, 0, 1, 0)
  shdr(6, SHT_REL, SHF_ALLOC, relOff, dynRels.length * 16, 4, 0, 8, 16)
  shdr(7, SHT_STRTAB, 0, shstrOff, shstrSize, 0, 0, 1, 0)
  return out
}

/** Reads the facts a loader checks from a linked shared object (for tests and `--check`). */
export function inspectSharedObject(so: Uint8Array): {
  type: number
  machine: number
  flags: number
  entry: number
  programHeaders: {type: number; flags: number; offset: number; vaddr: bigint; paddr: bigint; filesz: number; memsz: number}[]
  sections: {name: string; type: number; addr: number; offset: number; size: number; flags: number}[]
  dynamicSymbols: {name: string; value: number; defined: boolean}[]
  relocations: {offset: number; type: number; symbol: string}[]
} {
  const b = Buffer.from(so.buffer, so.byteOffset, so.byteLength)
  const phoff = Number(b.readBigUInt64LE(32))
  const programHeaders = Array.from({length: b.readUInt16LE(56)}, (_, i) => {
    const o = phoff + i * 56
    return {
      type: b.readUInt32LE(o),
      flags: b.readUInt32LE(o + 4),
      offset: Number(b.readBigUInt64LE(o + 8)),
      vaddr: b.readBigUInt64LE(o + 16),
      paddr: b.readBigUInt64LE(o + 24),
      filesz: Number(b.readBigUInt64LE(o + 32)),
      memsz: Number(b.readBigUInt64LE(o + 40)),
    }
  })
  const shoff = Number(b.readBigUInt64LE(40))
  const shnum = b.readUInt16LE(60)
  const shstrndx = b.readUInt16LE(62)
  const raw = Array.from({length: shnum}, (_, i) => {
    const o = shoff + i * 64
    return {
      nameOff: b.readUInt32LE(o),
      type: b.readUInt32LE(o + 4),
      flags: Number(b.readBigUInt64LE(o + 8)),
      addr: Number(b.readBigUInt64LE(o + 16)),
      offset: Number(b.readBigUInt64LE(o + 24)),
      size: Number(b.readBigUInt64LE(o + 32)),
      link: b.readUInt32LE(o + 40),
    }
  })
  const cstr = (off: number): string => {
    let e = off
    while (b[e] !== 0) e++
    return b.toString('utf8', off, e)
  }
  const sections = raw.map((s) => ({name: cstr(raw[shstrndx]!.offset + s.nameOff), type: s.type, addr: s.addr, offset: s.offset, size: s.size, flags: s.flags}))
  const dynsym = raw.find((s) => s.type === SHT_DYNSYM)
  const dynamicSymbols: {name: string; value: number; defined: boolean}[] = []
  if (dynsym) {
    const strOff = raw[dynsym.link].offset
    for (let o = dynsym.offset; o < dynsym.offset + dynsym.size; o += 24) {
      dynamicSymbols.push({name: cstr(strOff + b.readUInt32LE(o)), value: Number(b.readBigUInt64LE(o + 8)), defined: b.readUInt16LE(o + 6) !== 0})
    }
  }
  const relocations: {offset: number; type: number; symbol: string}[] = []
  for (const s of raw.filter((s) => s.type === SHT_REL)) {
    for (let o = s.offset; o < s.offset + s.size; o += 16) {
      const info = b.readBigUInt64LE(o + 8)
      relocations.push({offset: Number(b.readBigUInt64LE(o)), type: Number(info & 0xffffffffn), symbol: dynamicSymbols[Number(info >> 32n)]?.name ?? '?'})
    }
  }
  return {
    type: b.readUInt16LE(16),
    machine: b.readUInt16LE(18),
    flags: b.readUInt32LE(48),
    entry: Number(b.readBigUInt64LE(24)),
    programHeaders,
    sections,
    dynamicSymbols,
    relocations,
  }
}

/** CLI: tsx programs/tools/sbpf-link.ts [--sbpf v3|v0] input.o output.so */
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  const args = process.argv.slice(2)
  let version: SbpfVersion = 'v3'
  const flag = args.indexOf('--sbpf')
  if (flag >= 0) {
    version = args[flag + 1] as SbpfVersion
    args.splice(flag, 2)
  }
  const [input, output] = args
  if (!input || !output || (version !== 'v0' && version !== 'v3')) {
    console.error('usage: sbpf-link [--sbpf v3|v0] <input.o> <output.so>')
    process.exit(2)
  }
  try {
    const result = link(readFileSync(input), {file: input, version})
    const tmp = `${output}.tmp-${process.pid}`
    writeFileSync(tmp, result.so)
    renameSync(tmp, output)
    console.log(
      `${output}: sBPF ${version}, ${result.textSize / 8} instructions, ${result.rodataSize} bytes of read-only data, syscalls: ${result.syscalls.map((s) => `${s.name} (0x${s.hash.toString(16)})`).join(', ') || 'none'}`,
    )
  } catch (error) {
    if (!(error instanceof LinkError)) throw error
    console.error(`sbpf-link: ${error.message}`)
    process.exit(1)
  }
}
