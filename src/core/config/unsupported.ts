import type {RunConfigFile} from './types.js'

/** A part of a valid Psyche config that this implementation cannot serve, and why. */
export interface UnsupportedFeature {
  path: string
  reason: string
}

/**
 * The variants Psyche defines that we deliberately do not implement. Such a file still loads (it is
 * a valid Psyche config); commands that would run it must refuse with these reasons.
 */
export function unsupportedFeatures(file: RunConfigFile): UnsupportedFeature[] {
  const out: UnsupportedFeature[] = []
  const llm = file.model.LLM
  const checkpoint = llm.checkpoint
  if (typeof checkpoint === 'object' && ('Gcs' in checkpoint || 'P2PGcs' in checkpoint)) {
    const variant = 'Gcs' in checkpoint ? 'Gcs' : 'P2PGcs'
    out.push({path: `model.LLM.checkpoint.${variant}`, reason: 'Google Cloud Storage checkpoints are not supported (no GCS credentials support); use Hub, P2P or Local'})
  }
  const data = llm.data_location
  if (typeof data === 'object' && 'Http' in data && 'Gcp' in data.Http.location) {
    out.push({
      path: 'model.LLM.data_location.Http.location.Gcp',
      reason: 'reading a Google Cloud Storage bucket is not supported (no GCS credentials or bucket listing); use SingleUrl, NumberedFiles, Server or Local',
    })
  }
  if (typeof data === 'object' && ('WeightedHttp' in data || 'Preprocessed' in data)) {
    const variant = 'WeightedHttp' in data ? 'WeightedHttp' : 'Preprocessed'
    out.push({path: `model.LLM.data_location.${variant}`, reason: 'no data provider of ours serves it (they serve Local, Server and Http)'})
  }
  if (data === 'Dummy') out.push({path: 'model.LLM.data_location', reason: "Dummy is Psyche's test placeholder: there is no data to train on"})
  if (llm.optimizer === 'Dummy') out.push({path: 'model.LLM.optimizer', reason: "Dummy is Psyche's test placeholder: there is no optimizer to train with"})
  return out
}
