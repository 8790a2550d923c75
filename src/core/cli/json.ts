/**
 * `--json` output has one key style, snake_case like the wire. Core results keep their TypeScript names; a command
 * turns them into its JSON with `snakeKeys` at the edge.
 */

/** `tokensPerSecond` → `tokens_per_second`; a key already in snake_case is unchanged. */
export function snakeCase(key: string): string {
  return key.replace(/([a-z0-9])([A-Z])/g, '$1_$2').toLowerCase()
}

type SnakeKey<S extends string> = S extends `${infer H}${infer T}`
  ? T extends Uncapitalize<T>
    ? `${Lowercase<H>}${SnakeKey<T>}`
    : `${Lowercase<H>}_${SnakeKey<Uncapitalize<T>>}`
  : S

/** The type of `snakeKeys(value)`: every property name of plain objects in snake_case, recursively. */
export type SnakeKeys<T> = T extends readonly (infer E)[] ? SnakeKeys<E>[] : T extends object ? {[K in keyof T as K extends string ? SnakeKey<K> : K]: SnakeKeys<T[K]>} : T

/**
 * A copy of `value` with the property names of its plain objects in snake_case, recursively (arrays included).
 * Only for records with fixed field names: a map keyed by data (peer ids, file names) must not go through it.
 */
export function snakeKeys<T>(value: T): SnakeKeys<T> {
  if (Array.isArray(value)) return value.map((v) => snakeKeys(v)) as SnakeKeys<T>
  if (value !== null && typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype) {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [snakeCase(k), snakeKeys(v)])) as SnakeKeys<T>
  }
  return value as SnakeKeys<T>
}

/**
 * Property paths (`a.b_c.dE`) in `value` whose names are camelCase (have an upper-case letter): what a test of a `--json`
 * output asserts is empty. Data keys (hex peer ids, client names) are lower case and pass.
 */
export function nonSnakeKeys(value: unknown, path = ''): string[] {
  if (Array.isArray(value)) return value.flatMap((v, i) => nonSnakeKeys(v, `${path}[${i}]`))
  if (value === null || typeof value !== 'object') return []
  return Object.entries(value).flatMap(([k, v]) => {
    const here = path ? `${path}.${k}` : k
    return [...(/[A-Z]/.test(k) ? [here] : []), ...nonSnakeKeys(v, here)]
  })
}
