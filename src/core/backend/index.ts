export type {BackendConnector, CoordinatorBackend} from './types.js'
export {CoordinatorConnection} from './centralized/connection.js'
export {
  CoordinatorServer,
  serverIdentity,
  DEFAULT_MAX_SAVE_FAILURES,
  DEFAULT_PASSIVE_STATE_MS,
  SAVED_IDENTITY_FILE,
  SAVED_STATE_FILE,
  type CoordinatorServerOptions,
} from './centralized/server.js'
export {DEFAULT_LIMITS} from './centralized/limits.js'
