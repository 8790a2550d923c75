// Every test file, by tier. `npm test` runs the quick tiers (unit, sim, smoke): the answer in minutes.
// `npm run test:all` (what CI runs) adds the others. scripts/test.mjs refuses to run when a file under test/ is
// missing here or listed twice, so a new test file cannot slip out of both tiers: add it to the tier it belongs to.
//
//   unit     in-process: pure code, servers and libp2p nodes on loopback, a few short-lived CLI or Python processes
//   sim      the in-process simulation: real clients, coordinator, P2P and worker code in one process
//   smoke    the one multi-process training run of `npm test` (a server and three clients, each with its worker)
//   e2e      multi-process runs and CLI processes in bulk (training, faults, attacks, checkpoints, Solana)
//   net      several hosts in Linux network namespaces (root; they skip, saying why, where that cannot be done)
//   browser  the dashboard in headless Chromium
//   tmux     the live terminal views, captured from a tmux pane
//   bench    benchmarks' smoke runs (their small modes, which must keep working)

export const quickTiers = ['unit', 'sim', 'smoke']

export const tiers = {
  unit: [
    'test/adversarial/forge.test.ts',
    'test/backend/addresses.test.ts',
    'test/backend/connection.test.ts',
    'test/backend/restart.test.ts',
    'test/backend/server.test.ts',
    'test/checkpoint/checkpointer.test.ts',
    'test/checkpoint/hub-client-hostile.test.ts',
    'test/checkpoint/hub-server.test.ts',
    'test/cli/help.test.ts',
    'test/cli/json-signals.test.ts',
    'test/cli/model-init.test.ts',
    'test/cli/secrets.test.ts',
    'test/cli/terminal.test.ts',
    'test/client/decide.test.ts',
    'test/client/eval.test.ts',
    'test/client/ledger.test.ts',
    'test/config/commands.test.ts',
    'test/config/distro-limits.test.ts',
    'test/config/run-config.test.ts',
    'test/coordinator/accusations.test.ts',
    'test/coordinator/machine.test.ts',
    'test/coordinator/properties.test.ts',
    'test/coordinator/rules.test.ts',
    'test/coordinator/serialize.test.ts',
    'test/data/batches.test.ts',
    'test/data/http.test.ts',
    'test/data/local.test.ts',
    'test/data/providers.test.ts',
    'test/data/serve-command.test.ts',
    'test/data/tcp.test.ts',
    'test/data/tokenize.test.ts',
    'test/obs/dashboard-command.test.ts',
    'test/obs/metrics.test.ts',
    'test/obs/status.test.ts',
    'test/obs/terminal-view.test.ts',
    'test/p2p/addresses.test.ts',
    'test/p2p/limits.test.ts',
    'test/p2p/model-download.test.ts',
    'test/p2p/model.test.ts',
    'test/p2p/rejection.test.ts',
    'test/p2p/relay.test.ts',
    'test/p2p/results.test.ts',
    'test/protocol/identity.test.ts',
    'test/protocol/messages.test.ts',
    'test/scale/load-test-worker.test.ts',
    'test/solana/authorizer-program.test.ts',
    'test/solana/cli.test.ts',
    'test/solana/coordinator-program.test.ts',
    'test/solana/decode-fuzz.test.ts',
    'test/solana/rpc.test.ts',
    'test/solana/sbpf-link.test.ts',
    'test/solana/squatting.test.ts',
    'test/solana/vectors.test.ts',
    'test/testnet/summary.test.ts',
    'test/verify/copy.test.ts',
    'test/verify/intake.test.ts',
    'test/verify/result.test.ts',
    'test/verify/score.test.ts',
    'test/verify/scoreboard.test.ts',
  ],
  sim: ['test/checkpoint/hub-fallback.test.ts', 'test/scale/scale.test.ts', 'test/sim/simulation.test.ts', 'test/solana/client.test.ts'],
  smoke: ['test/e2e/smoke.test.ts'],
  e2e: [
    'test/adversarial/attacks.test.ts',
    'test/backend/commands.test.ts',
    'test/checkpoint/jobs.test.ts',
    'test/checkpoint/p2p-join.test.ts',
    'test/checkpoint/run-checkpoint.test.ts',
    'test/checkpoint/run-from-hub.test.ts',
    'test/cli/compiled-cli.test.ts',
    'test/cli/train.test.ts',
    'test/client/cli.test.ts',
    'test/e2e/faults.test.ts',
    'test/e2e/three-clients.test.ts',
    'test/solana/e2e.test.ts',
    'test/worker/data-parallel.test.ts',
  ],
  net: ['test/net/nat.test.ts', 'test/net/segment.test.ts'],
  browser: ['test/obs/dashboard.e2e.test.ts'],
  tmux: ['test/obs/terminal-view.e2e.test.ts', 'test/obs/testnet-view.e2e.test.ts'],
  bench: ['test/bench/gpu-bench.test.ts'],
}
