/**
 * Run configuration: Psyche's `state.toml` / `config.toml` / `data.toml`, loaded and validated with
 * errors that name the file, the field path and what was expected.
 */
export * from './types.js'
export {ConfigError, formatIssue} from './read.js'
export {exchangesResults, innerSteps, validateRunConfig} from './run-config.js'
export {loadRunConfigFile, parseRunConfig, resolveConfigPath} from './run-config-file.js'
export {checkDataServerForRun, loadDataServerConfig, parseDataServerConfig} from './data-config.js'
export {programRefusal, programUnsupported, unsupportedFeatures} from './support.js'
export {summarizeRunConfig, type RunSummary} from './summary.js'
export {timingWarnings} from './timing.js'
