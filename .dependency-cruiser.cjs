/**
 * dependency-cruiser: the import graph of src/ must have no cycle (type-only imports included).
 * Run by scripts/check-cycles.mjs, which `npm test` and `npm run lint` call.
 */
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
  ],
  options: {
    doNotFollow: {path: 'node_modules'},
    exclude: {path: 'node_modules'},
    tsPreCompilationDeps: true,
    tsConfig: {fileName: 'tsconfig.json'},
  },
}
