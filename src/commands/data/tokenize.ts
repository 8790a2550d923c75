import {Flags} from '@oclif/core'
import {PsycheCommand} from '../../core/cli/base-command.js'
import {Progress, formatRate} from '../../core/cli/progress.js'
import {type TokenizeResult, tokenizeFiles} from '../../core/data/tokenize.js'

function bar(fraction: number, width = 24): string {
  const filled = Math.round(Math.min(1, Math.max(0, fraction)) * width)
  return `${'█'.repeat(filled)}${'░'.repeat(width - filled)}`
}

export default class DataTokenize extends PsycheCommand {
  static summary = 'Turn text or JSONL files into token files with a Hugging Face tokenizer'
  static description = `Each .jsonl/.ndjson line's text field is a document; any other file is one UTF-8 document. An end-of-text token follows every document. Writes tokens-NNNNN.bin and a manifest.json (token count, vocab size, tokenizer hash) that the data loaders check.`
  static examples = [
    '<%= config.bin %> data tokenize --input corpus.jsonl --tokenizer tokenizer.json --out data/train',
    '<%= config.bin %> data tokenize --input a.txt --input b.txt --tokenizer tokenizer.json --out data --token-size 4 --json',
  ]

  static flags = {
    input: Flags.string({summary: 'input file (repeat for several)', required: true, multiple: true}),
    tokenizer: Flags.string({summary: 'Hugging Face tokenizer.json', required: true}),
    out: Flags.string({summary: 'output directory', required: true}),
    'token-size': Flags.integer({summary: 'bytes per token id (2: TwoBytes, 4: FourBytes)', options: ['2', '4'], default: 2}),
    'text-field': Flags.string({summary: 'JSONL field holding the text', default: 'text'}),
    'eos-token': Flags.string({summary: "token appended after each document (default: the tokenizer's <|endoftext|>, </s>, <eos> or <|end_of_text|>)"}),
    'no-eos': Flags.boolean({summary: 'append nothing between documents'}),
    'shard-tokens': Flags.integer({summary: 'most token ids per output file', min: 1}),
    force: Flags.boolean({summary: 'replace token data already in the output directory'}),
  }

  async run(): Promise<TokenizeResult> {
    const {flags} = await this.parse(DataTokenize)
    const progress = Progress.for({json: this.jsonEnabled()})
    const started = performance.now()
    progress.status(`tokenizing ${flags.input.length} file(s)`)
    const result = await tokenizeFiles({
      inputs: flags.input,
      tokenizer: flags.tokenizer,
      out: flags.out,
      tokenSize: flags['token-size'] as 2 | 4,
      textField: flags['text-field'],
      eosToken: flags['eos-token'],
      noEos: flags['no-eos'],
      shardTokens: flags['shard-tokens'],
      force: flags.force,
      onProgress: ({bytesDone, bytesTotal, tokens}) => {
        const fraction = bytesTotal ? bytesDone / bytesTotal : 1
        const rate = tokens / Math.max(1e-3, (performance.now() - started) / 1000)
        progress.update(`${bar(fraction)} ${(fraction * 100).toFixed(0).padStart(3)}%  ${tokens.toLocaleString('en-US')} tokens  ${formatRate(rate)} tok/s`)
      },
    }).catch((error) => {
      progress.fail('tokenizing failed')
      throw error
    })
    progress.done(`${result.tokens.toLocaleString('en-US')} tokens (vocab ${result.vocab_size}) in ${result.files.length} file(s) → ${result.dir}`)
    return result
  }
}
