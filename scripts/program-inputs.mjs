// What a Solana program build depends on, hashed: the build script caches on it and a test checks
// that the committed programs/build/*.so were built from the committed sources.
import {createHash} from 'node:crypto'
import {readFileSync, readdirSync} from 'node:fs'
import {join} from 'node:path'

export const CFLAGS = ['-target', 'bpf', '-mcpu=v2', '-O2', '-ffreestanding', '-fno-builtin', '-Wall', '-Werror', '-mllvm', '-bpf-stack-size=4096']

export const PROGRAMS = [
  {name: 'psyche_coordinator', dir: 'programs/coordinator', source: 'programs/coordinator/coordinator.c', also: ['programs/include/sbpf.h', 'programs/include/psyche_layout.h']},
  {name: 'psyche_authorizer', dir: 'programs/authorizer', source: 'programs/authorizer/authorizer.c', also: ['programs/include/sbpf.h', 'programs/include/psyche_layout.h']},
  {name: 'psyche_treasurer', dir: 'programs/treasurer', source: 'programs/treasurer/treasurer.c', also: ['programs/include/sbpf.h', 'programs/include/psyche_layout.h']},
]

export function programInputsHash(root, program) {
  const h = createHash('sha256')
  h.update(`cflags:${CFLAGS.join(' ')}\n`)
  const files = [
    ...readdirSync(join(root, program.dir))
      .filter((f) => f.endsWith('.c') || f.endsWith('.h'))
      .sort()
      .map((f) => join(program.dir, f)),
    ...(program.also ?? []),
    'programs/tools/sbpf-link.ts',
  ]
  for (const file of files) {
    h.update(`${file}\n`)
    h.update(readFileSync(join(root, file)))
  }
  return h.digest('hex')
}
