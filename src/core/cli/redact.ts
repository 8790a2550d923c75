/**
 * No output carries a secret. Error messages are built from user input (flags, URLs, file contents, a server's
 * answer) and may echo a token; everything a command prints about a failure goes through `redactSecrets` first.
 */

/** Environment variables whose values are secrets wherever they appear. */
const SECRET_ENV_VARS = ['HF_TOKEN', 'HUGGING_FACE_HUB_TOKEN'] as const

/** Flags whose values are secrets (`--hub-token hf_…`, `--hub-token=hf_…`). */
const SECRET_FLAGS = ['--hub-token', '--token']

/** Hugging Face tokens (hf_ + at least 8 characters) and `Authorization: Bearer …` values. */
const TOKEN_PATTERNS = [/\bhf_[A-Za-z0-9_-]{8,}/g, /(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}/gi]

const REDACTED = '[redacted]'

/** The secret values known to this process: secret environment variables and the values of secret flags in `argv`. */
export function knownSecrets(env: NodeJS.ProcessEnv = process.env, argv: readonly string[] = process.argv): string[] {
  const secrets = new Set<string>()
  for (const name of SECRET_ENV_VARS) {
    const value = env[name]
    if (value && value.length >= 4) secrets.add(value)
  }
  for (let i = 0; i < argv.length; i++) {
    for (const flag of SECRET_FLAGS) {
      if (argv[i] === flag && argv[i + 1] && argv[i + 1].length >= 4) secrets.add(argv[i + 1])
      else if (argv[i].startsWith(`${flag}=`) && argv[i].length >= flag.length + 5) secrets.add(argv[i].slice(flag.length + 1))
    }
  }
  // Longest first, so a secret that contains another is replaced whole.
  return [...secrets].sort((a, b) => b.length - a.length)
}

/** `text` with every known secret and anything shaped like a token replaced by `[redacted]`. */
export function redactSecrets(text: string, secrets: readonly string[] = knownSecrets()): string {
  let out = text
  for (const secret of secrets) out = out.split(secret).join(REDACTED)
  for (const pattern of TOKEN_PATTERNS) out = out.replace(pattern, (_match, bearer?: string) => (typeof bearer === 'string' ? `${bearer}${REDACTED}` : REDACTED))
  return out
}
