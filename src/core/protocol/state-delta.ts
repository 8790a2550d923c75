import type {CoordinatorState} from '../coordinator/types.js'

/**
 * State deltas: what changed between two coordinator states, so that the centralized server sends each client the
 * few bytes an event changed (a witness proof, a phase) instead of the whole state, whose size grows with the number
 * of clients (rosters, blooms): with N clients a full push per event cost O(N²) bytes and signatures (bench/README.md,
 * "Scale"). A delta costs about the size of the change.
 *
 * The coordinator machine never mutates a state and shares what did not change, so a change is found by walking
 * both states and stopping wherever they are the same object. A value that the new state took over from somewhere
 * else in the old one (the round becoming the previous round) travels as a copy of that old path, not as its bytes.
 *
 * Ops, applied in order to the previous state (which is never mutated: changed containers are copied):
 *   {p: path, v: value}   set the value at path (a new key goes last, as JSON.stringify would write it)
 *   {p: path, d: 1}       delete the key at path
 *   {p: path, a: [...]}   append items to the array at path
 *   {p: path, c: path}    set the value at path to the value at path c of the PREVIOUS state
 * The receiver checks the result against the SHA-256 of the new state's serialization (sent beside the ops), so a
 * delta that does not rebuild exactly the sender's state is never used (the receiver asks for the whole state).
 */

export type PathKey = string | number
export type DeltaOp = {p: PathKey[]; v: unknown} | {p: PathKey[]; d: 1} | {p: PathKey[]; a: unknown[]} | {p: PathKey[]; c: PathKey[]}

/** Bounds on a delta from the wire (a state's depth is under 10). */
const MAX_DELTA_OPS = 4096
const MAX_DELTA_PATH = 16
const FORBIDDEN_KEYS = new Set(['__proto__', 'constructor', 'prototype'])

type Obj = Record<string, unknown>
const isObj = (v: unknown): v is Obj => v !== null && typeof v === 'object' && !Array.isArray(v)

/** Keys JSON.stringify writes, in its order (undefined-valued keys are dropped). */
function jsonKeys(o: Obj): string[] {
  return Object.keys(o).filter((k) => o[k] !== undefined && typeof o[k] !== 'function')
}

class NotDiffable extends Error {}

/**
 * The ops that turn `prev` into `next` (both coordinator states, or any JSON-shaped values); `undefined` when no
 * delta can express it (a BigInt value): send the whole state then.
 */
export function diffState(prev: CoordinatorState, next: CoordinatorState): DeltaOp[] | undefined {
  try {
    return diffValues(prev, next)
  } catch (error) {
    if (error instanceof NotDiffable) return undefined
    throw error
  }
}

export function diffValues(prev: unknown, next: unknown): DeltaOp[] {
  const ops: DeltaOp[] = []
  if (prev === next) return ops
  // Where each container of the previous state was (values moved to another path travel as copies).
  const where = new Map<object, PathKey[]>()
  const index = (v: unknown, path: PathKey[]) => {
    if (v === null || typeof v !== 'object' || where.has(v)) return
    where.set(v, path)
    if (Array.isArray(v)) v.forEach((x, i) => index(x, [...path, i]))
    else for (const k of jsonKeys(v as Obj)) if (!FORBIDDEN_KEYS.has(k)) index((v as Obj)[k], [...path, k])
  }
  index(prev, [])
  const plain = (v: unknown): unknown => {
    if (typeof v === 'bigint') throw new NotDiffable('bigint')
    return v
  }
  /**
   * Where a new object was made from: the old object that held its first container value under the same key (the
   * round that became the previous round while it took one more witness record: a copy of the old round and the
   * record, not the whole round with its roster).
   */
  const origin = (b: Obj): PathKey[] | undefined => {
    for (const k of jsonKeys(b)) {
      const v = b[k]
      if (v === null || typeof v !== 'object') continue
      const at = where.get(v)
      if (!at || at.length === 0 || at.length > MAX_DELTA_PATH || at[at.length - 1] !== k) return undefined
      const parent = at.slice(0, -1)
      return isObj(get(prev, parent)) ? parent : undefined
    }
    return undefined
  }
  const walk = (a: unknown, b: unknown, path: PathKey[], copied = false): void => {
    if (a === b) return
    if (b !== null && typeof b === 'object') {
      const from = where.get(b)
      if (from && from.length <= MAX_DELTA_PATH) {
        ops.push({p: path, c: from})
        return
      }
    }
    if (!copied && isObj(b)) {
      const from = origin(b)
      if (from && !(from.length === path.length && from.every((k, i) => k === path[i]))) {
        const mark = ops.length
        ops.push({p: path, c: from})
        walk(get(prev, from), b, path, true)
        // Nearly all of it changed after all: the value alone.
        if (ops.length === mark + 2 && 'v' in ops[mark + 1] && ops[mark + 1].p.length === path.length) ops.splice(mark, 1)
        return
      }
    }
    if (isObj(a) && isObj(b)) {
      const ak = jsonKeys(a)
      const bk = jsonKeys(b)
      const kept = ak.filter((k) => b[k] !== undefined && typeof b[k] !== 'function')
      // Same order as JSON writes it: the kept keys first, in their old order, then the new ones.
      // (A key the receiver refuses in a path, such as __proto__, goes inside a whole value instead.)
      const inOrder = kept.every((k, i) => bk[i] === k) && !ak.some((k) => FORBIDDEN_KEYS.has(k)) && !bk.some((k) => FORBIDDEN_KEYS.has(k))
      if (inOrder) {
        for (const k of ak) if (b[k] === undefined || typeof b[k] === 'function') ops.push({p: [...path, k], d: 1})
        for (const k of bk) {
          if (a[k] === undefined || typeof a[k] === 'function') ops.push({p: [...path, k], v: plain(b[k])})
          else walk(a[k], b[k], [...path, k])
        }
        return
      }
    } else if (Array.isArray(a) && Array.isArray(b) && b.length >= a.length) {
      const mark = ops.length
      for (let i = 0; i < a.length; i++) walk(a[i], b[i], [...path, i])
      // Most items changed: one set of the whole array is smaller.
      if (ops.length - mark <= Math.max(1, b.length / 2)) {
        if (b.length > a.length) ops.push({p: path, a: b.slice(a.length).map(plain)})
        return
      }
      ops.length = mark
    }
    if (typeof b === 'bigint' || containsBigInt(b)) throw new NotDiffable('bigint')
    ops.push({p: path, v: b})
  }
  walk(prev, next, [])
  return ops
}

function containsBigInt(v: unknown): boolean {
  if (typeof v === 'bigint') return true
  if (v === null || typeof v !== 'object') return false
  if (Array.isArray(v)) return v.some(containsBigInt)
  return Object.values(v).some(containsBigInt)
}

function get(root: unknown, path: PathKey[]): unknown {
  let v = root
  for (const k of path) {
    if (Array.isArray(v) && typeof k === 'number' && Number.isInteger(k) && k >= 0 && k < v.length) v = v[k]
    else if (isObj(v) && typeof k === 'string' && Object.hasOwn(v, k)) v = v[k]
    else throw new RangeError(`state delta: no value at ${JSON.stringify(path)}`)
  }
  return v
}

/**
 * Applies ops (from diffState, or checked by parseDeltaOps) to `prev`, which is left unchanged. Throws a RangeError
 * when an op does not fit the state (a path that does not exist, a key on an array...).
 */
export function applyDelta<T>(prev: T, ops: readonly DeltaOp[]): T {
  if (ops.length === 0) return prev
  const fresh = new WeakSet<object>()
  const own = <C extends object>(c: C): C => {
    if (fresh.has(c)) return c
    const copy = (Array.isArray(c) ? [...c] : {...c}) as C
    fresh.add(copy)
    return copy
  }
  let root: unknown = prev
  for (const op of ops) {
    const value = 'c' in op ? get(prev, op.c) : 'v' in op ? op.v : undefined
    if (op.p.length === 0) {
      if ('v' in op || 'c' in op) root = value
      else if ('a' in op && Array.isArray(root)) (root = own(root)).push(...op.a)
      else throw new RangeError('state delta: only set, copy and append apply to the whole state')
      continue
    }
    if (root === null || typeof root !== 'object') throw new RangeError('state delta: the state is not an object')
    root = own(root as object)
    let parent = root as Obj | unknown[]
    for (let i = 0; i < op.p.length - 1; i++) {
      const k = op.p[i]
      const child = get(parent, [k])
      if (child === null || typeof child !== 'object') throw new RangeError(`state delta: no container at ${JSON.stringify(op.p.slice(0, i + 1))}`)
      const mine = own(child as object)
      ;(parent as Obj)[k as string] = mine
      parent = mine as Obj | unknown[]
    }
    const last = op.p[op.p.length - 1]
    if ('a' in op) {
      const arr = get(parent, [last])
      if (!Array.isArray(arr)) throw new RangeError(`state delta: ${JSON.stringify(op.p)} is not a list`)
      const mine = own(arr)
      mine.push(...op.a)
      ;(parent as Obj)[last as string] = mine
    } else if (Array.isArray(parent)) {
      if (typeof last !== 'number' || !Number.isInteger(last) || last < 0 || last > parent.length || 'd' in op)
        throw new RangeError(`state delta: bad list index at ${JSON.stringify(op.p)}`)
      parent[last] = value
    } else if ('d' in op) {
      if (typeof last !== 'string' || !Object.hasOwn(parent, last)) throw new RangeError(`state delta: no key to delete at ${JSON.stringify(op.p)}`)
      delete parent[last]
    } else {
      if (typeof last !== 'string') throw new RangeError(`state delta: a list index on an object at ${JSON.stringify(op.p)}`)
      parent[last] = value
    }
  }
  return root as T
}

function parsePath(v: unknown, where: string): PathKey[] {
  if (!Array.isArray(v) || v.length > MAX_DELTA_PATH) throw new RangeError(`${where} must be a list of at most ${MAX_DELTA_PATH} keys`)
  return v.map((k, i) => {
    if (typeof k === 'number' && Number.isSafeInteger(k) && k >= 0) return k
    if (typeof k === 'string' && k.length <= 256 && !FORBIDDEN_KEYS.has(k)) return k
    throw new RangeError(`${where}[${i}] must be a key or an index`)
  })
}

/** Checks ops from the wire (bounded, well-formed, no prototype keys); throws a RangeError naming the bad op. */
export function parseDeltaOps(raw: unknown): DeltaOp[] {
  if (!Array.isArray(raw) || raw.length > MAX_DELTA_OPS) throw new RangeError(`ops must be a list of at most ${MAX_DELTA_OPS}`)
  return raw.map((op: unknown, i): DeltaOp => {
    const where = `ops[${i}]`
    if (!isObj(op)) throw new RangeError(`${where} must be an object`)
    const keys = Object.keys(op).sort().join(',')
    const p = parsePath(op.p, `${where}.p`)
    if (keys === 'p,v') return {p, v: op.v}
    if (keys === 'd,p' && op.d === 1) return {p, d: 1}
    if (keys === 'a,p' && Array.isArray(op.a)) return {p, a: op.a}
    if (keys === 'c,p') return {p, c: parsePath(op.c, `${where}.c`)}
    throw new RangeError(`${where} must be {p, v}, {p, d: 1}, {p, a: [...]} or {p, c}`)
  })
}
