/**
 * The wire: ed25519 identities, length-prefixed frames and signed envelopes of the client ↔
 * coordinator protocol (messages.ts documents the byte layout), and atomic file writes.
 */
export * from './identity.js'
export * from './frames.js'
export * from './messages.js'
export {writeFileAtomicSync} from './atomic-file.js'
