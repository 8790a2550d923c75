import {readFileSync, renameSync, writeFileSync} from 'node:fs'

/**
 * The post-link step of the program build: turns one relocatable eBPF object (clang `-target bpf
 * -mcpu=v2 -c`, or `llc -march=bpfel -filetype=obj`) into the sBPF v0 shared object the Solana loader
 * accepts. No available linker writes that format (lld: "unsupported e_machine 247"; bpf-ld:
 * "-shared not supported"), so this is the linker.
 *
 * Output layout (every allocated section at file offset = virtual address, as the v0 loader maps the
 * file bytes from MM_PROGRAM_START = 0x1_0000_0000):
 *
 *   ELF header · program headers · .text · .rodata · .dynamic · .dynsym · .dynstr · .rel.dyn · .shstrtab · section headers
 *
 * - Calls between our own functions become pc-relative `call imm` (the loader registers their targets).
 * - A call to an undefined symbol must name a known syscall: it gets a dynamic symbol and an
 *   R_BPF_64_32 relocation, its imm is -1, and the loader writes murmur3(name) into it. Unknown names
 *   are refused here rather than at deploy time.
 * - `lddw` of a read-only object gets its absolute address (MM_PROGRAM_START + address) directly.
 * - `callx` carries its register in the immediate field (sBPF v0), not in the register fields.
 * - Writable data (.data, .bss: mutable globals) is refused: the v0 loader rejects it.
 * - Instructions sBPF v0 lacks (JMP32, atomics, sign-extending loads) are refused with the cpu to use.
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

export interface LinkResult {
  /** The sBPF v0 shared object. */
  so: Buffer
  /** Syscalls the program calls, with their murmur3 keys. */
  syscalls: {name: string; hash: number}[]
  textSize: number
  rodataSize: number
  entry: number
}

/** Links one relocatable eBPF object into an sBPF v0 shared object. `entrypoint` names the entry function. */
export function link(object: Uint8Array, options: {file?: string; entrypoint?: string} = {}): LinkResult {
  const file = options.file ?? 'object'
  const entryName = options.entrypoint ?? 'entrypoint'
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

  // Layout: headers, then .text (8-aligned), then .rodata, each at offset = address.
  const PHNUM = 4
  let cursor = 64 + PHNUM * 56
  const base = new Map<number, number>() // section index -> output address
  cursor = align(cursor, 8)
  const textStart = cursor
  for (const s of code) {
    if (s.size % 8) fail(`code section ${s.name} is not a whole number of instructions`)
    cursor = align(cursor, 8)
    base.set(s.index, cursor)
    cursor += s.size
  }
  const textEnd = cursor
  const rodataStart = align(cursor, 8)
  cursor = rodataStart
  for (const s of rodata) {
    cursor = align(cursor, Math.max(1, s.align))
    base.set(s.index, cursor)
    cursor += s.size
  }
  const rodataEnd = cursor

  const text = Buffer.alloc(textEnd - textStart)
  for (const s of code) bytes.copy(text, base.get(s.index)! - textStart, s.offset, s.offset + s.size)
  const ro = Buffer.alloc(rodataEnd - rodataStart)
  for (const s of rodata) bytes.copy(ro, base.get(s.index)! - rodataStart, s.offset, s.offset + s.size)

  const symbolAddress = (sym: Symbol, what: string): number => {
    const b = base.get(sym.shndx)
    if (b === undefined) fail(`${what}: symbol ${JSON.stringify(sym.name || `section ${sym.shndx}`)} is not in code or read-only data`)
    return b! + sym.value
  }

  const syscalls: string[] = []
  const dynRels: {offset: number; name: string}[] = []
  const codeRels = new Set<number>() // output offsets of instructions a relocation fixed

  for (const [target, list] of rels) {
    const targetSection = sections[target]
    if (!targetSection || !(targetSection.flags & BigInt(SHF_ALLOC))) continue // debug info (.BTF.ext ...)
    const into = base.get(target)
    if (into === undefined) continue // empty section
    const isCode = code.includes(targetSection)
    for (const r of list) {
      const sym = symbols[r.sym] ?? fail(`relocation names symbol ${r.sym}, which does not exist`)
      const at = into + r.offset
      if (isCode) {
        const o = at - textStart
        if (o % 8 || o + 8 > text.length) fail(`relocation at ${r.offset} in ${targetSection.name} is not on an instruction`)
        const opcode = text[o]
        if (r.type === R_BPF_64_64) {
          if (opcode !== 0x18 || o + 16 > text.length) fail(`R_BPF_64_64 at ${r.offset} is not on a lddw`)
          const addend = text.readInt32LE(o + 4)
          const address = MM_PROGRAM_START + BigInt(symbolAddress(sym, 'lddw') + addend)
          text.writeUInt32LE(Number(address & 0xffffffffn), o + 4)
          text.writeUInt32LE(Number(address >> 32n), o + 12)
          codeRels.add(o)
        } else if (r.type === R_BPF_64_32) {
          if (opcode !== 0x85) fail(`R_BPF_64_32 at ${r.offset} is not on a call`)
          if (sym.shndx === 0) {
            if (!KNOWN_SYSCALLS.includes(sym.name)) fail(`call to unknown function ${JSON.stringify(sym.name)}: it is neither defined in the program nor a Solana syscall`)
            if (!syscalls.includes(sym.name)) syscalls.push(sym.name)
            dynRels.push({offset: at, name: sym.name})
            text.writeInt32LE(-1, o + 4)
          } else {
            const sec = sections[sym.shndx]
            if (!code.includes(sec)) fail(`call to ${JSON.stringify(sym.name)}, which is not code`)
            const destination = sym.type === STT_SECTION ? base.get(sym.shndx)! + (text.readInt32LE(o + 4) + 1) * 8 : symbolAddress(sym, 'call')
            text.writeInt32LE((destination - (at + 8)) / 8, o + 4)
          }
          text[o + 1] = 0 // no BPF_PSEUDO_CALL marker in sBPF
          codeRels.add(o)
        } else fail(`unsupported relocation type ${r.type} in ${targetSection.name} (to ${JSON.stringify(sym.name)})`)
      } else {
        const o = at - rodataStart
        if (r.type !== R_BPF_64_ABS64) fail(`unsupported relocation type ${r.type} in read-only data ${targetSection.name}`)
        const addend = ro.readBigInt64LE(o)
        ro.writeBigUInt64LE(MM_PROGRAM_START + BigInt(symbolAddress(sym, 'pointer in read-only data')) + addend, o)
      }
    }
  }

  // Instruction checks and sBPF v0 encodings.
  for (let o = 0; o < text.length; o += 8) {
    const op = text[o]
    const cls = op & 7
    const at = `${file}: instruction ${o / 8} (opcode 0x${op.toString(16).padStart(2, '0')})`
    if (cls === 6) throw new LinkError(`${at}: JMP32 instructions (BPF cpu v3) do not exist in sBPF v0; compile with -mcpu=v2`)
    if ((cls === 1 || cls === 3) && (op & 0xe0) === 0x80) throw new LinkError(`${at}: sign-extending loads (BPF cpu v4) do not exist in sBPF v0`)
    if (cls === 3 && (op & 0xe0) === 0xc0) throw new LinkError(`${at}: atomic instructions do not exist in sBPF v0`)
    if (op === 0x85 && !codeRels.has(o)) {
      // A call the compiler resolved itself: pc-relative already; drop the pseudo-call marker.
      text[o + 1] = 0
    }
    if (op === 0x8d) {
      const dst = text[o + 1] & 15
      const src = text[o + 1] >> 4
      const reg = dst || src || text.readInt32LE(o + 4)
      if (reg < 0 || reg > 9) throw new LinkError(`${at}: callx register r${reg} is not r0..r9`)
      text[o + 1] = 0
      text.writeInt32LE(reg, o + 4)
    }
    if (op === 0x18) o += 8 // lddw is two slots
  }

  const entrySym = symbols.find((s) => s.name === entryName && s.type === STT_FUNC && s.bind === STB_GLOBAL && code.some((c) => c.index === s.shndx))
  if (!entrySym) fail(`no global function ${JSON.stringify(entryName)} (the program's entrypoint)`)
  const entry = symbolAddress(entrySym!, 'entrypoint')

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
  dynsymEntries.push({name: addStr(entryName), info: (STB_GLOBAL << 4) | STT_FUNC, shndx: 1, value: entry, size: entrySym!.size})
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
    const o = 64 + i * 56
    out.writeUInt32LE(type, o)
    out.writeUInt32LE(flags, o + 4)
    out.writeBigUInt64LE(BigInt(off), o + 8)
    out.writeBigUInt64LE(BigInt(off), o + 16)
    out.writeBigUInt64LE(BigInt(off), o + 24)
    out.writeBigUInt64LE(BigInt(size), o + 32)
    out.writeBigUInt64LE(BigInt(size), o + 40)
    out.writeBigUInt64LE(BigInt(alignTo), o + 48)
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
    const o = dynsymOff + i * 24
    out.writeUInt32LE(s.name, o)
    out[o + 4] = s.info
    out.writeUInt16LE(s.shndx, o + 6)
    out.writeBigUInt64LE(BigInt(s.value), o + 8)
    out.writeBigUInt64LE(BigInt(s.size), o + 16)
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
    const o = shOff + i * 64
    out.writeUInt32LE(shstrOffsets[i], o)
    out.writeUInt32LE(type, o + 4)
    out.writeBigUInt64LE(BigInt(flags), o + 8)
    out.writeBigUInt64LE(BigInt(flags & SHF_ALLOC ? off : 0), o + 16)
    out.writeBigUInt64LE(BigInt(off), o + 24)
    out.writeBigUInt64LE(BigInt(size), o + 32)
    out.writeUInt32LE(link, o + 40)
    out.writeUInt32LE(info, o + 44)
    out.writeBigUInt64LE(BigInt(alignTo), o + 48)
    out.writeBigUInt64LE(BigInt(entsize), o + 56)
  }
  shdr(1, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, textStart, textEnd - textStart, 0, 0, 8, 0)
  shdr(2, SHT_PROGBITS, SHF_ALLOC, rodataStart, rodataEnd - rodataStart, 0, 0, 8, 0)
  shdr(3, SHT_DYNAMIC, SHF_ALLOC, dynamicOff, DYN_COUNT * 16, 5, 0, 8, 16)
  shdr(4, SHT_DYNSYM, SHF_ALLOC, dynsymOff, dynsymEntries.length * 24, 5, 1, 8, 24)
  shdr(5, SHT_STRTAB, SHF_ALLOC, dynstrOff, dynstr.length, 0, 0, 1, 0)
  shdr(6, SHT_REL, SHF_ALLOC, relOff, dynRels.length * 16, 4, 0, 8, 16)
  shdr(7, SHT_STRTAB, 0, shstrOff, shstrSize, 0, 0, 1, 0)

  return {so: out, syscalls: syscalls.map((name) => ({name, hash: murmur3(name)})), textSize: text.length, rodataSize: ro.length, entry}
}

/** Reads the facts a loader checks from a linked shared object (for tests and `--check`). */
export function inspectSharedObject(so: Uint8Array): {
  type: number
  machine: number
  flags: number
  entry: number
  sections: {name: string; type: number; addr: number; offset: number; size: number; flags: number}[]
  dynamicSymbols: {name: string; value: number; defined: boolean}[]
  relocations: {offset: number; type: number; symbol: string}[]
} {
  const b = Buffer.from(so.buffer, so.byteOffset, so.byteLength)
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
  const sections = raw.map((s) => ({name: cstr(raw[shstrndx].offset + s.nameOff), type: s.type, addr: s.addr, offset: s.offset, size: s.size, flags: s.flags}))
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
  return {type: b.readUInt16LE(16), machine: b.readUInt16LE(18), flags: b.readUInt32LE(48), entry: Number(b.readBigUInt64LE(24)), sections, dynamicSymbols, relocations}
}

/** CLI: tsx programs/tools/sbpf-link.ts input.o output.so */
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  const [input, output] = process.argv.slice(2)
  if (!input || !output) {
    console.error('usage: sbpf-link <input.o> <output.so>')
    process.exit(2)
  }
  try {
    const result = link(readFileSync(input), {file: input})
    const tmp = `${output}.tmp-${process.pid}`
    writeFileSync(tmp, result.so)
    renameSync(tmp, output)
    console.log(
      `${output}: ${result.textSize / 8} instructions, ${result.rodataSize} bytes of read-only data, syscalls: ${result.syscalls.map((s) => `${s.name} (0x${s.hash.toString(16)})`).join(', ') || 'none'}`,
    )
  } catch (error) {
    if (!(error instanceof LinkError)) throw error
    console.error(`sbpf-link: ${error.message}`)
    process.exit(1)
  }
}
