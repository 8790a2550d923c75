#!/usr/bin/env bash
# Builds .gpu-carry/ (gitignored) for bench/gpu-check.sh, on a machine with the network and `npm ci` done, for a
# GPU machine that has CUDA torch and transformers but no network, no Node and no pyzmq:
#   bundle/x/gpu.bench.mjs   bench/gpu.bench.ts and its imports as one ES module (esbuild; three folders below the
#                            repository root, where the sources' own paths expect it)
#   node_modules/            zeromq (its Linux x64 addons only) and the loader it needs, left out of the bundle
#                            (so is litesvm, a Solana test chain the testnet part would load, which is not run there)
#   node.gz                  this machine's Node binary
#   wheels/                  pyzmq (the version python/requirements.txt pins) for CPython 3.11 to 3.13, manylinux x86_64
#   demo-corpus/             the demo corpus, built here (the GPU machine has no npm package to build it from)
# Everything together stays under the 64 MiB that a lent machine's call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-carry
rm -rf "$out"
mkdir -p "$out/bundle/x" "$out/wheels" "$out/node_modules/zeromq/build/linux" "$out/node_modules/cmake-ts/build"

npx esbuild bench/gpu.bench.ts --bundle --platform=node --format=esm --target=node20 --external:zeromq --external:litesvm --log-level=warning \
  --banner:js="import {createRequire as __psycheRequire} from 'node:module'; const require = __psycheRequire(import.meta.url);" \
  --outfile="$out/bundle/x/gpu.bench.mjs"

cp -r node_modules/zeromq/package.json node_modules/zeromq/lib "$out/node_modules/zeromq/"
cp -r node_modules/zeromq/build/linux/x64 "$out/node_modules/zeromq/build/linux/"
cp node_modules/zeromq/build/manifest.json "$out/node_modules/zeromq/build/"
cp node_modules/cmake-ts/package.json "$out/node_modules/cmake-ts/"
cp node_modules/cmake-ts/build/loader.js "$out/node_modules/cmake-ts/build/"

gzip -c -6 "$(command -v node)" >"$out/node.gz"

pyzmq=$(grep -E '^pyzmq==' python/requirements.txt | cut -d= -f3)
for v in 311 312 313; do
  .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --dest "$out/wheels" \
    --python-version "$v" --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 "pyzmq==$pyzmq"
done

node --import tsx --input-type=module -e "import {ensureDemoCorpus} from './src/core/corpus.ts'; await ensureDemoCorpus()"
cp -r .cache/demo-corpus "$out/demo-corpus"

du -sh "$out"
size=$(du -sm "$out" | cut -f1)
if [ "$size" -ge 64 ]; then
  echo "gpu-prepare: $out is ${size} MiB, over the 64 MiB a call carries" >&2
  exit 1
fi
