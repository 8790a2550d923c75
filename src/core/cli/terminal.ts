/** The parts of a stream that decide whether it is a terminal that can show a live display. */
interface Stream {
  isTTY?: boolean
  columns?: number
}

/**
 * True when a live display (ora's spinner, the ink view) may be drawn: stdout and stderr are both terminals with
 * a width, and not in CI. A terminal of 0 columns (some CI runners, `stty cols 0`, a detached pty) gets plain lines:
 * a spinner there redraws forever without ever fitting a line. A redirected stdout also means plain lines, so
 * a log file never fills with escape codes.
 */
export function liveTerminal(env: NodeJS.ProcessEnv = process.env, stdout: Stream = process.stdout, stderr: Stream = process.stderr): boolean {
  if (env.CI) return false
  return Boolean(stdout.isTTY && stderr.isTTY) && (stdout.columns ?? 0) > 0 && (stderr.columns ?? 0) > 0
}
