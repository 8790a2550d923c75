import {Flags} from '@oclif/core'
import {PsycheError} from '../errors.js'
import {DEFAULT_WEBRTC_LIMITS, parseStunServer, SENT_CANDIDATES, type WebRtcLimits} from '../p2p/webrtc.js'

/** `psyche join`'s WebRTC flags (UDP hole punching between clients that meet through a relay; see p2p/webrtc.ts). */
export const webrtcFlags = {
  webrtc: Flags.boolean({
    summary: 'connect directly over UDP (WebRTC, ICE) to peers met through a relay, before TCP hole punching; --no-webrtc: TCP punching and the relay only',
    default: true,
    allowNo: true,
  }),
  stun: Flags.string({
    summary: "a STUN server (host:port) for WebRTC, beside each relay's own; no public STUN server is used unless named here",
    multiple: true,
  }),
  'webrtc-max-connections': Flags.integer({
    summary: 'WebRTC connections open or being set up at once (peers beyond it stay on TCP punching or the relay)',
    default: DEFAULT_WEBRTC_LIMITS.maxConnections,
    min: 1,
  }),
  'webrtc-max-candidates': Flags.integer({
    summary: `ICE candidates accepted from a peer per connection attempt (more: the attempt is refused); at least ${SENT_CANDIDATES}, what a psyche peer sends`,
    default: DEFAULT_WEBRTC_LIMITS.maxCandidates,
    min: SENT_CANDIDATES,
  }),
  'webrtc-max-message-kib': Flags.integer({
    summary: 'largest WebRTC data-channel message accepted, KiB (announced to the peer; a larger one closes the connection)',
    default: DEFAULT_WEBRTC_LIMITS.maxMessageBytes / 1024,
    min: 16,
    max: 4096,
  }),
}

interface WebRtcFlagValues {
  webrtc: boolean
  stun?: string[]
  'webrtc-max-connections': number
  'webrtc-max-candidates': number
  'webrtc-max-message-kib': number
}

/** The P2P node's WebRTC options from the flags; a bad --stun is a usage error naming it. */
export function webrtcOptionsFromFlags(flags: WebRtcFlagValues): {webrtc: boolean; stun?: string[]; webrtcLimits: WebRtcLimits} {
  for (const s of flags.stun ?? []) {
    try {
      parseStunServer(s)
    } catch (error) {
      throw new PsycheError(`--stun ${(error as Error).message}`, {code: 'EUSAGE'})
    }
  }
  return {
    webrtc: flags.webrtc,
    ...(flags.stun ? {stun: flags.stun} : {}),
    webrtcLimits: {
      maxConnections: flags['webrtc-max-connections'],
      maxCandidates: flags['webrtc-max-candidates'],
      maxMessageBytes: flags['webrtc-max-message-kib'] * 1024,
    },
  }
}
