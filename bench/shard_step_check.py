"""A 2-rank FSDP step of a sharded client (python/psyche_worker/sharding.py) against an unsharded one: NCCL on
cuda:0 and cuda:1 (`--device cuda`, bench/gpu-check.sh on a machine with 2 or more GPUs), or gloo on CPU
(`--device cpu`, the script's dry run). Two DisTrO rounds with delay correction, fp32, each applying the previous
round's own result: the results and the parameter hashes must be the unsharded client's, bit for bit.

    .venv/bin/python bench/shard_step_check.py --device cuda [--template llama2-20m] [--rounds 2]

Prints one JSON line; exits 1 if the sharded client's bytes differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999, "compression_chunk": 64, "compression_topk": 8, "quantize_1bit": True}}
SCHEDULE = {"Constant": {"base_lr": 4e-4, "warmup_steps": 0, "warmup_init_lr": 0}}
WORLD, ROWS, SEQ = 2, 4, 65


def _batches(vocab: int, rounds: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (ROWS, SEQ), generator=g).to(torch.int32) for _ in range(rounds)]


def _rounds(trainer, batches) -> tuple[list[str], list[str], list[float]]:
    """Results (SHA-256), parameter hashes and losses of each round."""
    import hashlib

    from psyche_worker.model import hash_sorted_tensors

    results, hashes, losses, previous = [], [], [], None
    for step, tokens in enumerate(batches, 1):
        losses.append(trainer.begin_round(tokens, step)["loss"])
        _, result = trainer.finish_round(step, None if previous is None else step - 1, [] if previous is None else [previous])
        results.append(hashlib.sha256(result).hexdigest())
        hashes.append(hash_sorted_tensors(trainer.whole_parameters()))
        previous = result
    return results, hashes, losses


def _trainer(config: dict, device: torch.device, sharding=None):
    from psyche_worker.model import init_model
    from psyche_worker.trainer import Trainer

    trainer = Trainer(init_model(config, 0), device, precision="fp32", sharding=sharding)
    # micro-batches of one rank's rows on both clients: FSDP's sum adds what the accumulation adds
    trainer.configure(DISTRO, SCHEDULE, micro_batch=ROWS // WORLD, delay_correction=True)
    return trainer


def _rank(rank: int, port: int, config: dict, kind: str, rounds: int, out) -> None:
    torch.set_num_threads(1)
    from psyche_worker.parallel import join_group
    from psyche_worker.sharding import Sharding

    device = torch.device("cpu" if kind == "cpu" else f"cuda:{rank}")
    group = join_group(rank, WORLD, port, device)
    trainer = _trainer(config, device, Sharding(rank, WORLD, group.data))
    got = _rounds(trainer, _batches(config["vocab_size"], rounds))
    backend = torch.distributed.get_backend(group.data)
    out.put((rank, got, backend))
    torch.distributed.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    from psyche_worker.parallel import free_port

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cuda", "cpu"], required=True)
    parser.add_argument("--template", default="llama2-20m")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        print(json.dumps({"ran": False, "why": f"{torch.cuda.device_count()} GPU(s): the 2-rank NCCL step needs 2"}))
        sys.exit(2)
    config = json.loads((ROOT / "templates" / args.template / "model" / "config.json").read_text())
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, config, args.device, args.rounds, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = sorted((out.get(timeout=300) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join(timeout=60)
    sharded_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    torch.set_num_threads(1)
    single = _rounds(_trainer(config, torch.device("cpu" if args.device == "cpu" else "cuda:0")), _batches(config["vocab_size"], args.rounds))
    identical = all(g[1] == single for g in got)
    print(
        json.dumps(
            {
                "ranks": WORLD,
                "backend": got[0][2],
                "template": args.template,
                "rounds": args.rounds,
                "identical": identical,
                "results_equal": [all(g[1][0][i] == single[0][i] for g in got) for i in range(args.rounds)],
                "hashes_equal": [all(g[1][1][i] == single[1][i] for g in got) for i in range(args.rounds)],
                "losses": single[2],
                "model_changed": len(set(single[1])) == args.rounds,
                "sharded_seconds": round(sharded_seconds, 1),
                "unsharded_seconds": round(time.perf_counter() - t1, 1),
            }
        )
    )
    sys.exit(0 if identical and len(set(single[1])) == args.rounds else 1)


if __name__ == "__main__":
    main()
