// Public API of the peer-to-peer layer (node.ts puts the libp2p services together: dialer.ts, reachability.ts, result-exchange.ts, model-exchange.ts).
export {P2PNode, peerIdOfClient, RESULT_PROTOCOL, ResultStore} from './node.js'
export type {P2PNodeOptions} from './node.js'

export {signAnnouncement} from '../primitives/announcement.js'
export {resultCommitment} from '../primitives/pieces.js'
export type {ResultAnnouncement, SigningIdentity} from '../primitives/announcement.js'
export {validateModelHeader, manifestRoot, parseManifest, parseTensorRequest, signManifest} from './model.js'
export type {ModelSnapshot, ModelManifest} from './model.js'
export {downloadModel, chooseManifest, planPieces, BadPeerError, BusyPeerError} from './model-download.js'
export {DEFAULT_MODEL_SERVE_LIMITS} from './model-exchange.js'
export type {ModelPeerTransport} from './model-download.js'
