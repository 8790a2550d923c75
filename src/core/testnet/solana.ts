import {readFileSync} from 'node:fs'
import {generateKeyPairSigner, type Address} from '@solana/kit'
import {createRun, setPaused, updateConfig} from '../backend/solana/admin.js'
import {RpcChain} from '../backend/solana/chain.js'
import {addressOfClient} from '../backend/solana/layout.js'
import {AUTHORIZER_PROGRAM_PATH, COORDINATOR_PROGRAM_PATH, TREASURER_PROGRAM_PATH} from '../backend/solana/local-chain.js'
import {Localnet} from '../backend/solana/localnet.js'
import {loadRunConfigFile} from '../config/index.js'
import type {RunConfigFile} from '../config/types.js'
import {PsycheError} from '../errors.js'

/**
 * The coordinator of `psyche testnet --backend solana`: the committed programs in a localnet (LiteSVM behind the
 * JSON-RPC API, in this process), and the run created, configured and resumed through that API as a run creator
 * would (create-run, update-config, set-paused resume). Clients are funded by airdrop.
 */
export interface SolanaTestnet {
  url: string
  wsUrl: string
  programId: Address
  /** Airdrops SOL to a client (by its client id: hex public key) for its transactions and its peer record. */
  fund(clientId: string): void
  close(): Promise<void>
}

/**
 * A run on Solana takes its model from the Hub, peers or the plan (Dummy): a local model directory (the testnet's
 * `Local` checkpoint, which every client here reads from its --config) is the plan's model, so it goes on chain as
 * Dummy with the directory as its repo id.
 */
function onChainModel(file: RunConfigFile): RunConfigFile {
  const llm = file.model?.LLM
  if (!llm || typeof llm.checkpoint !== 'object' || !('Local' in llm.checkpoint)) return file
  return {...file, model: {LLM: {...llm, checkpoint: {Dummy: {repo_id: llm.checkpoint.Local.path}}}}}
}

export async function startSolanaRun(statePath: string): Promise<SolanaTestnet> {
  const file = onChainModel(await loadRunConfigFile(statePath))
  if (!file.run_id) throw new PsycheError(`${statePath}: run_id: a testnet needs a state.toml with a run_id`)
  const programId = (await generateKeyPairSigner()).address
  const authorizer = (await generateKeyPairSigner()).address
  const net = new Localnet({
    port: 0,
    programs: [
      {address: programId, bytes: readFileSync(COORDINATOR_PROGRAM_PATH)},
      {address: authorizer, bytes: readFileSync(AUTHORIZER_PROGRAM_PATH)},
      {address: (await generateKeyPairSigner()).address, bytes: readFileSync(TREASURER_PROGRAM_PATH)},
    ],
  })
  const url = await net.start()
  try {
    const creator = await generateKeyPairSigner()
    net.chain.airdrop(creator.address)
    const target = {chain: new RpcChain(url), programId, runId: file.run_id}
    await createRun({...target, payer: creator, mainAuthority: creator.address, joinAuthority: null, authorizer: null})
    await updateConfig({...target, authority: creator, file})
    await setPaused({...target, authority: creator, paused: false})
  } catch (error) {
    await net.close()
    throw error
  }
  return {
    url,
    wsUrl: net.wsUrl,
    programId,
    fund: (clientId) => net.chain.airdrop(addressOfClient(clientId)),
    close: () => net.close(),
  }
}
