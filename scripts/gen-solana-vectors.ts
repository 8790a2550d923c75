// `npm run vectors:solana [-- out.json]`: writes the shared coordinator vectors (event sequences and the
// state after each, from the TypeScript reference in src/core/coordinator) to a JSON file (default
// .cache/solana-vectors.json), for checking another implementation. test/solana/vectors.test.ts
// generates the same vectors in-process and replays them against programs/coordinator.
import {mkdirSync, renameSync, writeFileSync} from 'node:fs'
import {dirname, join, resolve} from 'node:path'
import {fileURLToPath} from 'node:url'
import {capacity, generateVectors} from '../test/solana/vectors.js'

const out = resolve(process.argv[2] ?? join(dirname(fileURLToPath(import.meta.url)), '..', '.cache', 'solana-vectors.json'))
const vectors = await generateVectors()
vectors.scenarios.push(await capacity()) // MAX_CLIENTS clients (test/solana/capacity.test.ts replays it)
mkdirSync(dirname(out), {recursive: true})
writeFileSync(`${out}.tmp`, `${JSON.stringify(vectors, null, 1)}\n`)
renameSync(`${out}.tmp`, out)
const steps = vectors.scenarios.reduce((n, s) => n + s.steps.length, 0)
console.log(`${out}: ${vectors.scenarios.length} scenarios, ${steps} steps`)
