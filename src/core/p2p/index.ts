// Public API of the peer-to-peer layer (node.ts puts the libp2p services together: dialer.ts, reachability.ts, result-exchange.ts, model-exchange.ts).
export {
  P2PNode,
  peerIdOfClient,
  resultsTopic,
  RESULT_PROTOCOL,
  MODEL_PROTOCOL,
  DEFAULT_MAX_BLOB_BYTES,
  DEFAULT_MAX_CONCURRENT_DOWNLOADS,
  DEFAULT_DOWNLOAD_TIMEOUT_MS,
  DEFAULT_MAX_MODEL_BYTES,
  ResultStore,
} from './node.js'
export type {P2PNodeOptions, P2PStats} from './node.js'
export {defaultTransports} from './transports.js'
export type {TransportFactory} from './transports.js'
export {announcementSigningBytes, parseAnnouncement, signAnnouncement, sha256Hex, MAX_ANNOUNCEMENT_BYTES} from '../primitives/announcement.js'
export type {ResultAnnouncement, SigningIdentity, UnsignedAnnouncement} from '../primitives/announcement.js'
export {validateModelHeader, dtypeBytes, manifestRoot, parseManifest, parseTensorRequest, signManifest, MAX_TENSORS_PER_REQUEST} from './model.js'
export type {ModelFrame, ModelSnapshot, ModelManifest, ManifestTensor} from './model.js'
export {downloadModel, chooseManifest, planPieces, BadPeerError} from './model-download.js'
export type {ModelPeerTransport, ModelDownload, ModelDownloadOptions} from './model-download.js'
