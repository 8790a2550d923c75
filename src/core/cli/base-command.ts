import {Command, Errors} from '@oclif/core'
import {PsycheError} from '../errors.js'
import {Shutdown} from './signals.js'

/**
 * Base of every psyche command: `--json` (oclif prints what `run` returns), user errors as one
 * line (`Error: <file>: <field>: <what>`) with a non-zero exit instead of a stack trace, and signals
 * (`this.shutdown`: SIGINT/SIGTERM/SIGHUP end the command at once unless it asks to stop in order).
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

  /** True when output should be plain (no spinners, no colour): --json, or stdout is not a terminal. */
  protected get plain(): boolean {
    return this.jsonEnabled() || !process.stdout.isTTY || Boolean(process.env.CI)
  }

  protected async catch(error: Error & {exitCode?: number}): Promise<unknown> {
    if (error instanceof PsycheError) {
      if (this.jsonEnabled()) {
        this.logJson({error: {code: error.code, message: error.message}})
      } else {
        process.stderr.write(`Error: ${error.message}\n`)
      }
      process.exitCode = error.exitCode
      throw new Errors.ExitError(error.exitCode)
    }
    return super.catch(error)
  }
}
