#!/usr/bin/env node
// The `psyche` entry point. It runs the JavaScript that `npm run setup` (scripts/build.mjs) compiled into dist/,
// with oclif's command manifest, so a command starts without compiling TypeScript and loads only its own modules.
// When dist/ is missing or older than src/ (a stamp of the sources' sizes and mtimes, checked in a few ms),
// it runs the TypeScript sources through tsx instead, so an edit in src/ always takes effect; `npm run build`
// makes it fast again. PSYCHE_FROM_SOURCE=1 forces the sources.
import {distDir, distIsFresh, distPjson} from '../scripts/build.mjs'

if (process.env.PSYCHE_FROM_SOURCE !== '1' && distIsFresh()) {
  const {execute, settings} = await import('@oclif/core')
  settings.enableAutoTranspile = false
  await execute({dir: import.meta.url, loadOptions: {root: distDir, pjson: distPjson()}})
} else {
  const {register} = await import('tsx/esm/api')
  register()
  const {execute} = await import('@oclif/core')
  await execute({dir: import.meta.url})
}
