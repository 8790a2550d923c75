#!/usr/bin/env bash
# One command for a lent GPU machine: the Python suite with CUDA, on 2 or more GPUs a 2-rank FSDP step with NCCL
# against the unsharded client (bench/shard_step_check.py), DisTrO on the device at 20M and 1.1B with 1, 4, 16 and 64
# results (bench/gpu_distro.py), and `psyche train` against the plain bf16 loop (bench/gpu.bench.ts), printed as one
# JSON object on stdout. Each part runs under its own time limit, within GPU_CHECK_SECONDS (330)
# for the whole, most important first; a part that does not fit says so in the summary.
#
# The machine has CUDA torch and transformers but no network, no Node and no pyzmq: run bench/gpu-prepare.sh here
# first, and carry .gpu-carry with the working tree. `--cpu` runs every part on this CPU with the tiny-demo model
# (the dry run that proves the script and what it carries work); there the 2-rank step runs with gloo on 2 CPU
# processes, and GPU_CHECK_GPUS=1 takes the path of a one-GPU machine.
#
#   bash bench/gpu-check.sh [--cpu]
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mode=cuda
[ "${1:-}" = "--cpu" ] && mode=cpu
carry=$root/.gpu-carry
if [ ! -f "$carry/node.gz" ]; then
  echo '{"error": "no .gpu-carry: run bench/gpu-prepare.sh where there is a network, and carry .gpu-carry"}'
  exit 2
fi
start=$(date +%s)
budget=${GPU_CHECK_SECONDS:-330}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${PSYCHE_PYTHON:-}" ]; then
  py=$PSYCHE_PYTHON
elif [ -x .venv/bin/python ]; then
  py=$root/.venv/bin/python
else
  py=$(command -v python3)
fi
# pyzmq from the carried wheel, first on the path (in the dry run too, so it proves the install)
"$py" -m pip install --quiet --no-index --no-deps --find-links "$carry/wheels" --target "$work/site" pyzmq >"$work/pip.log" 2>&1
export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
export PSYCHE_PYTHON=$py
gunzip -c "$carry/node.gz" >"$work/node" && chmod +x "$work/node"
if [ ! -f .cache/demo-corpus/corpus.json ]; then
  mkdir -p .cache && rm -rf .cache/demo-corpus && cp -r "$carry/demo-corpus" .cache/demo-corpus
fi

# part NAME LIMIT_SECONDS COMMAND...: stdout, stderr, exit status and seconds in $work/NAME.*
part() {
  local name=$1 limit=$2
  shift 2
  local left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 20 ]; then
    echo "not run: the check's $budget s were spent" >"$work/$name.skipped"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0
  t0=$(date +%s)
  timeout "$limit" "$@" >"$work/$name.out" 2>"$work/$name.err"
  echo $? >"$work/$name.rc"
  echo $(($(date +%s) - t0)) >"$work/$name.seconds"
}

# shard_step GPUS: the 2-rank FSDP step (issue: models larger than one GPU) where there are 2 ranks to run it on; on
# one GPU it only says so (no torch import: ~0 s)
shard_step() {
  local gpus=$1
  if [ "$mode" = cpu ] && [ -z "${GPU_CHECK_GPUS:-}" ]; then
    part shard_2_ranks 90 "$py" bench/shard_step_check.py --device cpu --template tiny-demo
  elif [ "$gpus" -ge 2 ]; then
    part shard_2_ranks 90 "$py" bench/shard_step_check.py --device "$mode" --template llama2-20m
  else
    echo "$gpus GPU: the 2-rank NCCL step needs 2; not run" >"$work/shard_2_ranks.skipped"
  fi
}
if [ -n "${GPU_CHECK_GPUS:-}" ]; then
  gpus=$GPU_CHECK_GPUS
elif [ "$mode" = cuda ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  [ "$gpus" -ge 1 ] 2>/dev/null || gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
else
  gpus=0
fi

bench_env=(env BENCH_GPU_PARTS=train BENCH_GPU_REPEATS=1)
if [ "$mode" = cuda ]; then
  part pytest 150 "$py" -m pytest -q -p no:cacheprovider -rs --junitxml="$work/pytest.xml" python/tests
  shard_step "$gpus"
  distro=("$py" bench/gpu_distro.py --device cuda --seq-len 1024 --peers 1,4,16,64 --warmup 2 --repeats 5)
  part distro_llama2-20m 60 "${distro[@]}" --model-config templates/llama2-20m/model/config.json --batch 32 --micro-batch 16
  part distro_llama-1b 120 "${distro[@]}" --model-config templates/llama-1b/model/config.json --batch 8 --micro-batch 4
  part train_llama2-20m 90 "${bench_env[@]}" BENCH_GPU_MODELS=llama2-20m "$work/node" "$carry/bundle/x/gpu.bench.mjs" --json
  part train_llama-1b 150 "${bench_env[@]}" BENCH_GPU_MODELS=llama-1b "$work/node" "$carry/bundle/x/gpu.bench.mjs" --json
else
  part pytest 150 "$py" -m pytest -q -p no:cacheprovider -rs --junitxml="$work/pytest.xml" python/tests/test_distro_wire.py
  shard_step "$gpus"
  part distro_tiny-demo 120 "$py" bench/gpu_distro.py --model-config templates/tiny-demo/model/config.json --device cpu --seq-len 32 --batch 4 --micro-batch 4 --peers 1,4,16,64 --warmup 1 --repeats 2 --threads 2
  part train_tiny-demo 240 "${bench_env[@]}" BENCH_GPU_STEPS=6 "$work/node" "$carry/bundle/x/gpu.bench.mjs" --device cpu --tiny --json
fi

"$py" - "$work" "$mode" "$budget" "$(($(date +%s) - start))" "$gpus" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

work, mode, budget, seconds, gpus = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


summary = {"mode": mode, "gpus": gpus, "budget_seconds": budget, "seconds": seconds, "parts": {}}
names = sorted({p.name.split(".")[0] for p in work.iterdir() if p.suffix in (".rc", ".skipped")})
for name in names:
    if (work / f"{name}.skipped").exists():
        summary["parts"][name] = {"ran": False, "why": (work / f"{name}.skipped").read_text().strip()}
        continue
    rc = int((work / f"{name}.rc").read_text())
    out, err = (work / f"{name}.out").read_text(errors="replace"), (work / f"{name}.err").read_text(errors="replace")
    entry = {"ran": True, "exit": rc, "timed_out": rc == 124, "seconds": int((work / f"{name}.seconds").read_text())}
    if name == "pytest" and (work / "pytest.xml").exists():
        suite = ET.parse(work / "pytest.xml").getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        entry.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        entry["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
        entry["skip_reasons"] = sorted({s.get("message", "") for s in suite.iter("skipped")})
    else:
        result = last_json(out)
        if result is not None:
            entry["result"] = result
    if rc != 0:
        entry["stderr_tail"] = err[-2000:]
    summary["parts"][name] = entry
summary["parts"]["testnet"] = {"ran": False, "why": "needs the psyche CLI with its node_modules (bin/psyche.js spawns server and clients), more than a call carries"}
print(json.dumps(summary))
EOF
