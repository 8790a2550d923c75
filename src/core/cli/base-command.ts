import {Command, Errors} from '@oclif/core'
import {PsycheError} from '../errors.js'
import {redactSecrets} from './redact.js'
import {Shutdown} from './signals.js'
import {liveTerminal} from './terminal.js'

/** Exit code of a usage error (unknown flag, missing argument, bad flag value), as oclif's parser sets it. */
const USAGE_EXIT_CODE = 2

/**
 * Base of every psyche command: `--json` (oclif prints what `run` returns), user errors as one
 * line (`Error: <file>: <field>: <what>`) with a non-zero exit instead of a stack trace, and signals
 * (`this.shutdown`: SIGINT/SIGTERM/SIGHUP end the command at once unless it asks to stop in order).
 *
 * Under `--json` every failure is one JSON error object `{"error": {"code", "message"}}` on stdout: never oclif's
 * serialization of the error (which holds the whole configuration and environment, tokens included). Messages go
 * through `redactSecrets` in every mode.
 */
export abstract class PsycheCommand extends Command {
  static enableJsonFlag = true

  protected readonly shutdown = new Shutdown()

  protected async init(): Promise<unknown> {
    this.shutdown.install()
    return super.init()
  }

  protected async finally(error: Error | undefined): Promise<unknown> {
    this.shutdown.dispose()
    return super.finally(error)
  }

  /** True when output should be plain (no spinners, no live view): --json, or no terminal to draw on (liveTerminal). */
  protected get plain(): boolean {
    return this.jsonEnabled() || !liveTerminal()
  }

  /**
   * The command's --json output is a stream of one-line events (join, server run), not one object: a failure is one
   * more line, {"event": "error", "code", "message"}, on stdout like the rest.
   */
  protected get streamsEvents(): boolean {
    return false
  }

  /** How a failure is printed under --json: always on stdout (one object, or one more event line). */
  private writeJsonError(code: string, message: string): void {
    if (this.streamsEvents) process.stdout.write(`${JSON.stringify({event: 'error', code, message})}\n`)
    else this.logJson({error: {code, message}})
  }

  protected async catch(error: Error & {exitCode?: number; oclif?: {exit?: number}; code?: string}): Promise<unknown> {
    // this.exit(n) and a failure already reported: nothing more to print.
    if (error instanceof Errors.ExitError) {
      process.exitCode = error.oclif.exit ?? 1
      throw error
    }
    if (error instanceof PsycheError) {
      const message = redactSecrets(error.message)
      if (this.jsonEnabled()) this.writeJsonError(error.code, message)
      else process.stderr.write(`Error: ${message}\n`)
      process.exitCode = error.exitCode
      throw new Errors.ExitError(error.exitCode)
    }
    const usage = error instanceof Errors.CLIError && error.oclif?.exit === USAGE_EXIT_CODE
    if (this.jsonEnabled()) {
      // A usage error (the parser's), or a bug: one object, the message only.
      const code = usage ? 'EUSAGE' : typeof error.code === 'string' && /^E[A-Z_]+$/.test(error.code) ? error.code : 'EINTERNAL'
      const exitCode = usage ? USAGE_EXIT_CODE : (error.oclif?.exit ?? 1)
      this.writeJsonError(code, redactSecrets(error.message ?? String(error)))
      process.exitCode = exitCode
      throw new Errors.ExitError(exitCode)
    }
    if (typeof error.message === 'string') error.message = redactSecrets(error.message)
    return super.catch(error)
  }
}
