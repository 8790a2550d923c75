import {PsycheError} from '../errors.js'
import type {ConfigIssue} from './types.js'

/**
 * A small schema reader over parsed TOML: each accessor checks one field, records a located issue
 * instead of throwing, and returns a neutral stand-in value so the rest of the file is still checked — a user
 * sees every problem in one go. Unknown fields are issues too.
 */

export type Table = Record<string, unknown>

export function formatIssue(issue: ConfigIssue): string {
  const where = issue.path === '' ? issue.file : `${issue.file}: ${issue.path}`
  return issue.value === undefined ? `${where}: ${issue.message}` : `${where} = ${issue.value}: ${issue.message}`
}

/** A config file that failed validation; `issues` lists every problem, the message names the first. */
export class ConfigError extends PsycheError {
  readonly issues: ConfigIssue[]

  constructor(issues: ConfigIssue[]) {
    const more = issues.length > 1 ? ` (and ${issues.length - 1} more problem${issues.length > 2 ? 's' : ''})` : ''
    super(`${formatIssue(issues[0])}${more}`, {code: 'ECONFIG'})
    this.name = 'ConfigError'
    this.issues = issues
  }
}

function render(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value)
  if (typeof value === 'bigint') return value.toString()
  if (value !== null && typeof value === 'object') {
    const text = JSON.stringify(value, (_k, v) => (typeof v === 'bigint' ? v.toString() : v))
    return text.length > 60 ? `${text.slice(0, 57)}...` : text
  }
  return String(value)
}

export function join(path: string, key: string): string {
  return path === '' ? key : `${path}.${key}`
}

function isTable(value: unknown): value is Table {
  return value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof Date)
}

function typeName(value: unknown): string {
  if (Array.isArray(value)) return 'an array'
  if (isTable(value)) return 'a table'
  if (typeof value === 'bigint') return 'an integer too large'
  return `a ${typeof value}`
}

interface IntRule {
  min?: number
  max?: number
  default?: number
}

export class Reader {
  readonly issues: ConfigIssue[] = []

  constructor(readonly file: string) {}

  issue(path: string, message: string, value?: unknown): void {
    this.issues.push({file: this.file, path, message, ...(value === undefined ? {} : {value: render(value)})})
  }

  /** Reports every key of `table` not in `known`. */
  known(table: Table, path: string, known: readonly string[]): void {
    for (const key of Object.keys(table)) {
      if (!known.includes(key)) this.issue(join(path, key), `unknown field (expected one of: ${known.join(', ')})`)
    }
  }

  table(parent: Table, key: string, path: string): Table | undefined {
    const value = parent[key]
    const at = join(path, key)
    if (value === undefined) {
      this.issue(at, 'missing (expected a table)')
      return undefined
    }
    if (!isTable(value)) {
      this.issue(at, `must be a table, not ${typeName(value)}`, value)
      return undefined
    }
    return value
  }

  int(parent: Table, key: string, path: string, rule: IntRule = {}): number {
    const value = parent[key]
    const at = join(path, key)
    if (value === undefined) {
      if (rule.default !== undefined) return rule.default
      this.issue(at, 'missing (expected an integer)')
      return NaN
    }
    if (typeof value === 'bigint') {
      this.issue(at, `too large (max ${Number.MAX_SAFE_INTEGER})`, value)
      return NaN
    }
    if (typeof value !== 'number' || !Number.isSafeInteger(value)) {
      this.issue(at, `must be an integer, not ${typeof value === 'number' ? 'a fraction' : typeName(value)}`, value)
      return NaN
    }
    // Out of range reads as NaN, so rules spanning fields skip it instead of reporting it twice.
    if (rule.min !== undefined && value < rule.min) {
      this.issue(at, `must be ≥ ${rule.min}`, value)
      return NaN
    }
    if (rule.max !== undefined && value > rule.max) {
      this.issue(at, `must be ≤ ${rule.max}`, value)
      return NaN
    }
    return value
  }

  /** A finite number (TOML integers are accepted where Psyche has floats). */
  num(parent: Table, key: string, path: string, rule: {min?: number; max?: number; above?: number; below?: number; optional?: boolean} = {}): number {
    const value = parent[key]
    const at = join(path, key)
    if (value === undefined) {
      if (!rule.optional) this.issue(at, 'missing (expected a number)')
      return NaN
    }
    if (typeof value !== 'number' || !Number.isFinite(value)) {
      this.issue(at, `must be a finite number, not ${typeName(value)}`, value)
      return NaN
    }
    const broken =
      rule.min !== undefined && value < rule.min
        ? `must be ≥ ${rule.min}`
        : rule.max !== undefined && value > rule.max
          ? `must be ≤ ${rule.max}`
          : rule.above !== undefined && value <= rule.above
            ? `must be > ${rule.above}`
            : rule.below !== undefined && value >= rule.below
              ? `must be < ${rule.below}`
              : undefined
    if (broken) {
      this.issue(at, broken, value)
      return NaN
    }
    return value
  }

  str(parent: Table, key: string, path: string, rule: {nonEmpty?: boolean; default?: string; maxBytes?: number} = {}): string {
    const value = parent[key]
    const at = join(path, key)
    if (value === undefined) {
      if (rule.default !== undefined) return rule.default
      this.issue(at, 'missing (expected a string)')
      return ''
    }
    if (typeof value !== 'string') {
      this.issue(at, `must be a string, not ${typeName(value)}`, value)
      return ''
    }
    if (rule.nonEmpty && value.trim() === '') this.issue(at, 'must not be empty', value)
    else if (rule.maxBytes !== undefined && Buffer.byteLength(value) > rule.maxBytes) this.issue(at, `must be at most ${rule.maxBytes} bytes`, value)
    return value
  }

  bool(parent: Table, key: string, path: string): boolean {
    const value = parent[key]
    const at = join(path, key)
    if (value === undefined) {
      this.issue(at, 'missing (expected true or false)')
      return false
    }
    if (typeof value !== 'boolean') {
      this.issue(at, `must be true or false, not ${typeName(value)}`, value)
      return false
    }
    return value
  }

  oneOf<T extends string>(parent: Table, key: string, path: string, values: readonly T[], fallback?: T): T {
    const value = parent[key]
    const at = join(path, key)
    if (value === undefined) {
      if (fallback !== undefined) return fallback
      this.issue(at, `missing (expected one of: ${values.join(', ')})`)
      return values[0]
    }
    if (typeof value !== 'string' || !values.includes(value as T)) {
      this.issue(at, `must be one of: ${values.join(', ')}`, value)
      return values[0]
    }
    return value as T
  }

  /**
   * A serde externally tagged enum: a bare string for a unit variant (`"Dummy"`), or a table with
   * exactly one key naming the variant (`{Cosine = {...}}`, `[x.Cosine]`). Returns undefined when invalid.
   */
  tagged<T>(parent: Table, key: string, path: string, variants: {unit?: readonly string[]; data: Record<string, (payload: unknown, path: string) => T>}): T | undefined {
    const value = parent[key]
    const at = join(path, key)
    const unit = variants.unit ?? []
    const all = [...unit, ...Object.keys(variants.data)]
    if (value === undefined) {
      this.issue(at, `missing (expected one of: ${all.join(', ')})`)
      return undefined
    }
    if (typeof value === 'string') {
      if (unit.includes(value)) return value as T
      this.issue(
        at,
        Object.keys(variants.data).includes(value) ? `variant ${value} needs fields: write [${at}.${value}]` : `unknown variant (expected one of: ${all.join(', ')})`,
        value,
      )
      return undefined
    }
    if (!isTable(value)) {
      this.issue(at, `must be one of: ${all.join(', ')}, not ${typeName(value)}`, value)
      return undefined
    }
    const keys = Object.keys(value)
    if (keys.length !== 1) {
      this.issue(at, keys.length === 0 ? `empty (expected one of: ${all.join(', ')})` : `must name exactly one variant, found ${keys.join(', ')}`)
      return undefined
    }
    const variant = keys[0]
    const parse = variants.data[variant]
    if (parse === undefined) {
      this.issue(
        join(at, variant),
        unit.includes(variant) ? `variant ${variant} takes no fields: write ${key} = "${variant}"` : `unknown variant (expected one of: ${all.join(', ')})`,
      )
      return undefined
    }
    return parse(value[variant], join(at, variant))
  }

  /** A table payload of a tagged variant, with its allowed keys checked. */
  payload(value: unknown, path: string, known: readonly string[]): Table {
    if (!isTable(value)) {
      this.issue(path, `must be a table, not ${typeName(value)}`, value)
      return {}
    }
    this.known(value, path, known)
    return value
  }

  /** Throws a ConfigError listing every issue found, if any. */
  done(): void {
    if (this.issues.length > 0) throw new ConfigError(this.issues)
  }
}
