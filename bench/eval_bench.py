"""Validation cost: the worker's evaluate (held-out loss at the replicated parameters, DisTrO speculation set
aside) against one network-path training round (begin_round + finish_round) on the same number of samples.

Run: npm run bench -- eval   (or PYTHONPATH=python .venv/bin/python bench/eval_bench.py)

A client evaluates `join --eval-batches` samples (default 8) after every `--eval-every` rounds, right after it has
published its next result, while the worker would otherwise wait for the round to end. Medians of a few
repetitions after a warm-up, one torch thread; the machine is shared, so expect noise.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from psyche_worker.model import init_model  # noqa: E402
from psyche_worker.trainer import Trainer  # noqa: E402

DISTRO = {"Distro": {"compression_decay": 0.96, "compression_chunk": 64, "compression_topk": 8, "quantize_1bit": True}}


def bench(name: str, seq_len: int, samples: int, reps: int) -> None:
    cfg = json.loads((ROOT / "templates" / name / "model" / "config.json").read_text())
    t = Trainer(init_model(cfg, 0), torch.device("cpu"))
    t.configure(DISTRO, {"Constant": {"base_lr": 1e-3}}, micro_batch=samples, delay_correction=True)
    g = torch.Generator().manual_seed(0)
    held_out = torch.randint(0, cfg["vocab_size"], (samples, seq_len + 1), generator=g, dtype=torch.int32)
    train = torch.randint(0, cfg["vocab_size"], (samples, seq_len + 1), generator=g, dtype=torch.int32)
    rounds, evals = [], []
    for step in range(1, reps + 2):
        start = time.perf_counter()
        t.begin_round(train, step)
        t.finish_round(step, None, [])
        rounds.append(time.perf_counter() - start)
        start = time.perf_counter()
        t.evaluate_replicated(held_out)
        evals.append(time.perf_counter() - start)
    r, e = statistics.median(rounds[1:]), statistics.median(evals[1:])
    print(f"{name:12s} seq {seq_len:5d} × {samples} samples: evaluate {e * 1000:8.1f} ms   training round {r * 1000:8.1f} ms   ratio {e / r:.2f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    bench("tiny-demo", 128, 8, 7)
    bench("llama2-20m", 512, 8, 3)
