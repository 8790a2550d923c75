// One checkpoint job in its own process, for bench/checkpoint.bench.ts: prints the job's result and this
// process's peak resident memory as one JSON line. Usage: checkpoint-job.ts upload DIR REPO URL [MAX_SHARD] | download REPO URL OUT CACHE
import {downloadCheckpoint, uploadCheckpoint} from '../src/core/checkpoint/hub.js'

const [op, ...args] = process.argv.slice(2)
const result =
  op === 'upload'
    ? await uploadCheckpoint({dir: args[0]!, repo: args[1]!, hubUrl: args[2]!, token: 'hf_bench', maxShardBytes: args[3] ? Number(args[3]) : undefined})
    : await downloadCheckpoint({repo: args[0]!, hubUrl: args[1]!, out: args[2]!, cacheDir: args[3]!})
console.log(JSON.stringify({seconds: result.seconds, bytes: result.bytes, files: result.files.length, peak_rss_bytes: process.resourceUsage().maxRSS * 1024}))
