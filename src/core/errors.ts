/**
 * An error caused by the user's input or environment (a bad file, field, flag or peer), as opposed to a bug.
 * Commands print its message as one clear line and exit non-zero, never with a stack trace.
 */
export class PsycheError extends Error {
  readonly code: string
  readonly exitCode: number

  constructor(message: string, options: {code?: string; exitCode?: number; cause?: unknown} = {}) {
    super(message, {cause: options.cause})
    this.name = 'PsycheError'
    this.code = options.code ?? 'EPSYCHE'
    this.exitCode = options.exitCode ?? 1
  }
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}
