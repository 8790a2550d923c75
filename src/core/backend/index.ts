export type {BackendConnector, CoordinatorBackend, JoinRequest, PeerDirectory, RejectionInfo} from './types.js'
export {CoordinatorConnection, type ConnectOptions} from './centralized/connection.js'
export {CoordinatorServer, serverIdentity, SAVED_IDENTITY_FILE, SAVED_STATE_FILE, type CoordinatorServerOptions} from './centralized/server.js'
export {DEFAULT_LIMITS, LIMIT_FLAGS, type ServerLimits} from './centralized/limits.js'
