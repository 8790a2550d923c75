import {execFileSync} from 'node:child_process'
import {mkdirSync, writeFileSync} from 'node:fs'
import {gzipSync} from 'node:zlib'
import {join} from 'node:path'
import {parquetWriteBuffer} from 'hyparquet-writer'
import {pythonEnv, workerPython} from '../../src/core/worker/python.js'

/**
 * A tiny chat dataset made as a fine-tuning dataset is made: conversations rendered with a tokenizer's chat template
 * (transformers' apply_chat_template, whose {% generation %} blocks mark the assistant's tokens), cut or padded to
 * max_seq_len, with labels = the input id on the assistant's tokens and -100 elsewhere; written as Psyche's
 * Preprocessed Parquet (inputs, labels). The tokenizer is a word-level one built here (no Hub).
 */

const CONVERSATIONS = [
  [
    {role: 'user', content: 'what is the capital of france'},
    {role: 'assistant', content: 'the capital of france is paris'},
  ],
  [
    {role: 'user', content: 'name a color of the sky'},
    {role: 'assistant', content: 'the sky is blue'},
  ],
  [
    {role: 'user', content: 'how many legs has a cat'},
    {role: 'assistant', content: 'a cat has four legs'},
  ],
  [
    {role: 'user', content: 'what do bees make'},
    {role: 'assistant', content: 'bees make honey'},
    {role: 'user', content: 'and cows'},
    {role: 'assistant', content: 'cows make milk'},
  ],
]

const SCRIPT = `
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
conversations = json.loads(sys.stdin.read())
words = sorted({w for c in conversations for m in c for w in m["content"].split()})
specials = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"]
vocab = {t: i for i, t in enumerate(specials + words)}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
fast.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
fast.chat_template = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} "
    "{% else %}<|assistant|> {% generation %}{{ m['content'] }} {{ eos_token }}{% endgeneration %} {% endif %}{% endfor %}"
)
out = []
for c in conversations:
    r = fast.apply_chat_template(c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    out.append({"ids": list(r["input_ids"]), "assistant": list(r["assistant_masks"])})
print(json.dumps({"examples": out, "vocab_size": len(vocab), "pad": vocab["<pad>"]}))
`

interface ChatExample {
  ids: number[]
  /** 1 on the assistant's tokens (what the loss counts). */
  assistant: number[]
}

let tokenized: {examples: ChatExample[]; vocabSize: number; pad: number} | undefined

/** The examples tokenized with the chat template (unpadded); one Python process per test file. */
function chatExamples(): {examples: ChatExample[]; vocabSize: number; pad: number} {
  if (tokenized) return tokenized
  const out = execFileSync(workerPython(), ['-c', SCRIPT], {input: JSON.stringify(CONVERSATIONS), env: pythonEnv(), encoding: 'utf8'})
  const parsed = JSON.parse(out) as {examples: ChatExample[]; vocab_size: number; pad: number}
  tokenized = {examples: parsed.examples, vocabSize: parsed.vocab_size, pad: parsed.pad}
  return tokenized
}

/** Rows of exactly `length` ids: each example padded (pad id, label -100) or cut. */
export function chatRows(length: number, repeat = 1): {inputs: number[][]; labels: number[][]; examples: ChatExample[]} {
  const {examples, pad} = chatExamples()
  const inputs: number[][] = []
  const labels: number[][] = []
  for (let k = 0; k < repeat; k++) {
    for (const e of examples) {
      const ids = [...e.ids, ...Array<number>(Math.max(0, length - e.ids.length)).fill(pad)].slice(0, length)
      inputs.push(ids)
      labels.push(ids.map((id, i) => (i < e.ids.length && e.assistant[i] === 1 ? id : -100)))
    }
  }
  return {inputs, labels, examples}
}

const listOf = (name: string) => [
  {name, repetition_type: 'OPTIONAL' as const, converted_type: 'LIST' as const, num_children: 1},
  {name: 'list', repetition_type: 'REPEATED' as const, num_children: 1},
  {name: 'element', type: 'INT32' as const, repetition_type: 'OPTIONAL' as const},
]

/** A Parquet file with list<int32> columns, as Psyche's Preprocessed datasets are written (Snappy, or gzip). */
export function parquetOf(columns: Record<string, number[][]>, codec: 'SNAPPY' | 'GZIP' = 'SNAPPY'): Uint8Array {
  const names = Object.keys(columns)
  const buffer = parquetWriteBuffer({
    codec,
    compressors: {GZIP: (bytes: Uint8Array) => new Uint8Array(gzipSync(bytes))},
    columnData: names.map((name) => ({name, data: columns[name]})),
    schema: [{name: 'root', num_children: names.length}, ...names.flatMap(listOf)],
  })
  return new Uint8Array(buffer)
}

/** Writes a Preprocessed dataset directory (`dir/train.parquet`) of the chat rows and returns them. */
export function writeChatDataset(dir: string, length: number, repeat = 1): ReturnType<typeof chatRows> {
  const rows = chatRows(length, repeat)
  mkdirSync(dir, {recursive: true})
  writeFileSync(join(dir, 'train.parquet'), parquetOf({inputs: rows.inputs, labels: rows.labels}))
  return rows
}
