/**
 * dependency-cruiser: the import graph of src/ has no cycle (type-only imports included), no two folders of src/core
 * import each other (a folder-level cycle), and imports point down the layers only (docs/ARCHITECTURE.md, "Layers"):
 *
 *   7 commands/                      parse flags, call the core, render
 *   6 compose/ cli/                  the composition root (wires a client's components); command helpers
 *   5 client/                        the client's phases and its runner
 *   4 backend/ p2p/ worker/ data/ train/ obs/ testnet/ corpus.ts model.ts
 *   3 verify/ checkpoint/ config/ (reading config files, cross-checks, summaries)
 *   2 protocol/
 *   1 coordinator/ (pure) and the run configuration it is a function of: its schema (config/types.ts) and its
 *     pure validator (config/run-config.ts with its located-issue reader config/read.ts; no I/O)
 *   0 primitives/ (imports nothing of ours), layout/ (the layout table that the run configuration's validator, the
 *     coordinator, the Solana programs' generated header and the Solana backend share; imports nothing of ours) and the
 *     leaf modules errors.ts events.ts json-lines.ts secret-file.ts descriptors.ts
 *
 * A module may import its own layer and those below, with no exception. Run by scripts/check-cycles.mjs (npm run
 * lint, npm test).
 */
const LAYERS = [
  {level: 7, name: 'commands', path: '^src/commands/'},
  {level: 6, name: 'compose/cli', path: '^src/core/(compose|cli)/'},
  {level: 5, name: 'client', path: '^src/core/client/'},
  {level: 4, name: 'services', path: '^src/core/(backend|p2p|worker|data|train|obs|testnet)/|^src/core/(corpus|model)\\.ts$'},
  {level: 3, name: 'verify/checkpoint/config', path: '^src/core/(verify|checkpoint)/|^src/core/config/(?!(types|read|run-config)\\.ts$)'},
  {level: 2, name: 'protocol', path: '^src/core/protocol/'},
  {level: 1, name: 'coordinator', path: '^src/core/coordinator/|^src/core/config/(types|read|run-config)\\.ts$'},
  {level: 0, name: 'primitives/layout', path: '^src/core/(primitives|layout)/|^src/core/(errors|events|json-lines|secret-file|descriptors)\\.ts$'},
]

const above = (level) =>
  LAYERS.filter((l) => l.level > level)
    .map((l) => `(${l.path})`)
    .join('|')

const layerRules = LAYERS.filter((l) => l.level < 7).map((layer) => ({
  name: `layer-${layer.name.replace(/\//g, '-')}`,
  severity: 'error',
  comment: `${layer.name} (layer ${layer.level}) imports only its own layer and those below (see the comment at the top of .dependency-cruiser.cjs)`,
  from: {path: layer.path},
  to: {path: above(layer.level)},
}))

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'An import cycle: move the shared piece into a module both sides import (a port, a types file) instead.',
      from: {path: '^src/'},
      to: {circular: true},
    },
    {
      name: 'no-folder-cycle',
      severity: 'error',
      scope: 'folder',
      comment: 'A folder-level cycle: two folders of src/core import each other (through any of their modules). Move what they share down into a leaf folder both import.',
      from: {path: '^src/core/'},
      to: {circular: true},
    },
    {
      name: 'primitives-leaf',
      severity: 'error',
      comment: 'primitives/ imports nothing of ours outside primitives/ (node and npm packages only)',
      from: {path: '^src/core/primitives/'},
      to: {path: '^src/', pathNot: '^src/core/primitives/'},
    },
    {
      name: 'layout-leaf',
      severity: 'error',
      comment: 'layout/ imports nothing of ours outside layout/ (scripts/gen-layout.ts and every layer read it)',
      from: {path: '^src/core/layout/'},
      to: {path: '^src/', pathNot: '^src/core/layout/'},
    },
    ...layerRules,
    {
      name: 'unlayered',
      severity: 'error',
      comment: 'every module of src/ belongs to a layer: add a new folder to LAYERS in .dependency-cruiser.cjs',
      from: {path: '^src/', pathNot: LAYERS.map((l) => `(${l.path})`).join('|')},
      to: {},
    },
  ],
  options: {
    doNotFollow: {path: 'node_modules'},
    exclude: {path: 'node_modules'},
    tsPreCompilationDeps: true,
    tsConfig: {fileName: 'tsconfig.json'},
  },
}
