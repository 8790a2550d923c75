import ora, {type Ora} from 'ora'
import {liveTerminal} from './terminal.js'

export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) return '?'
  const s = Math.max(0, Math.round(seconds))
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`
}

export function formatRate(perSecond: number): string {
  return perSecond >= 1000 ? `${(perSecond / 1000).toFixed(1)}k` : perSecond.toFixed(0)
}

/**
 * Progress for long work: a spinner with a live line on a terminal (liveTerminal); on a pipe, a terminal of
 * 0 columns or in CI, plain lines
 * at most every `plainEverySeconds`; nothing at all in `--json` mode (stdout carries only the result).
 */
export class Progress {
  private spinner: Ora | undefined
  private lastPlain = 0

  constructor(
    private readonly mode: 'tty' | 'plain' | 'silent',
    private readonly plainEverySeconds = 5,
  ) {}

  static for(options: {json: boolean}): Progress {
    if (options.json) return new Progress('silent')
    return new Progress(liveTerminal() ? 'tty' : 'plain')
  }

  /** A status message: shown as the spinner's text, or as a plain line. */
  status(text: string): void {
    if (this.mode === 'tty') {
      // discardStdin off: it puts a terminal's stdin in raw mode and spins when stdin is at EOF
      if (!this.spinner) this.spinner = ora({text, stream: process.stderr, discardStdin: false}).start()
      else this.spinner.text = text
    } else if (this.mode === 'plain') {
      process.stderr.write(`${text}\n`)
    }
  }

  /** A frequent update (every step): throttled when plain. `force` always prints (e.g. the last step). */
  update(text: string, force = false): void {
    if (this.mode === 'tty') return this.status(text)
    if (this.mode !== 'plain') return
    const now = performance.now() / 1000
    if (force || now - this.lastPlain >= this.plainEverySeconds) {
      this.lastPlain = now
      process.stderr.write(`${text}\n`)
    }
  }

  /** A line that stays (e.g. an evaluation result), printed above the spinner. */
  note(text: string): void {
    if (this.mode === 'silent') return
    if (this.spinner) {
      this.spinner.clear()
      process.stderr.write(`${text}\n`)
      this.spinner.render()
    } else process.stderr.write(`${text}\n`)
  }

  done(text?: string): void {
    if (this.spinner) {
      if (text) this.spinner.succeed(text)
      else this.spinner.stop()
      this.spinner = undefined
    } else if (text && this.mode === 'plain') process.stderr.write(`${text}\n`)
  }

  fail(text: string): void {
    if (this.spinner) {
      this.spinner.fail(text)
      this.spinner = undefined
    }
  }
}
