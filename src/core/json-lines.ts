/**
 * One line of a child process's JSON-lines output (the worker, the tokenizer, `psyche … --json`) as an
 * object, or undefined for anything else (a log line, a partial line, `null`), so callers skip it.
 */
export function parseJsonLine(line: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(line)
    return typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined
  } catch {
    return undefined
  }
}
