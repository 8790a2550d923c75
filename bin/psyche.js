#!/usr/bin/env node
// The `psyche` entry point: runs the TypeScript sources directly through tsx, so there is no build step.
import {register} from 'tsx/esm/api'
register()
const {execute} = await import('@oclif/core')
await execute({dir: import.meta.url})
