"""Memory per rank of a sharded client (python/psyche_worker/sharding.py): the bytes of parameters, gradients and
DisTrO state (momentum, the committed copy of delay correction, the speculation's int8 signs) that each rank holds
after two rounds, for 1 (unsharded), 2 and 4 ranks on CPU with gloo, and each rank's peak resident memory.

    .venv/bin/python bench/sharding_memory.py [--template llama2-20m] [--ranks 1,2,4]

Run from the repository root; the numbers go in bench/README.md ("Memory per rank of a sharded client").
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999, "compression_chunk": 64, "compression_topk": 8, "quantize_1bit": True}}
SCHEDULE = {"Constant": {"base_lr": 4e-4, "warmup_steps": 0, "warmup_init_lr": 0}}
ROWS, SEQ = 4, 65


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _measure(rank: int, world: int, port: int, config: dict, out) -> None:
    torch.set_num_threads(1)
    from psyche_worker.model import init_model
    from psyche_worker.trainer import Trainer

    sharding = None
    if world > 1:
        from psyche_worker.parallel import join_group
        from psyche_worker.sharding import Sharding

        group = join_group(rank, world, port, torch.device("cpu"))
        sharding = Sharding(rank, world, group.data)
    trainer = Trainer(init_model(config, 0), torch.device("cpu"), sharding=sharding)
    trainer.configure(DISTRO, SCHEDULE, micro_batch=max(1, ROWS // world), delay_correction=True)
    g = torch.Generator().manual_seed(1)
    previous = None
    for step in (1, 2):
        tokens = torch.randint(0, config["vocab_size"], (ROWS, SEQ), generator=g).to(torch.int32)
        trainer.begin_round(tokens, step)
        _, previous = trainer.finish_round(step, None if previous is None else step - 1, [] if previous is None else [previous])
    peer = trainer.optimizer.peers[0]
    params = [_local(p) for p in trainer.model.parameters()]
    grads = [None if p.grad is None else _local(p.grad) for p in trainer.model.parameters()]
    state = [*peer._momentum, *(peer._committed_buffers or []), *(peer._own_signs or [])]
    out.put(
        {
            "rank": rank,
            "parameters": _bytes(params),
            "gradients": _bytes(grads),
            "distro_state": _bytes(state),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
    )
    if world > 1:
        torch.distributed.destroy_process_group()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def main() -> None:
    import torch.multiprocessing as mp

    from psyche_worker.parallel import free_port

    parser = argparse.ArgumentParser()
    parser.add_argument("--template", default="llama2-20m")
    parser.add_argument("--ranks", default="1,2,4")
    args = parser.parse_args()
    config = json.loads((ROOT / "templates" / args.template / "model" / "config.json").read_text())
    ctx = mp.get_context("spawn")
    rows = []
    for world in (int(w) for w in args.ranks.split(",")):
        out, port = ctx.Queue(), free_port()
        procs = [ctx.Process(target=_measure, args=(r, world, port, config, out)) for r in range(world)]
        for p in procs:
            p.start()
        got = sorted((out.get(timeout=900) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join(timeout=60)
        rows.append((world, got))
    mib = lambda n: f"{n / 2**20:,.1f}"  # noqa: E731
    print("| ranks | parameters MiB | gradients MiB | DisTrO state MiB | total MiB (max over ranks) | vs unsharded | peak RSS MiB (max) |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for world, got in rows:
        totals = [r["parameters"] + r["gradients"] + r["distro_state"] for r in got]
        top = max(range(len(got)), key=lambda i: totals[i])
        r = got[top]
        base = base or totals[top]
        print(
            f"| {world} | {mib(r['parameters'])} | {mib(r['gradients'])} | {mib(r['distro_state'])} | {mib(totals[top])} | "
            f"{totals[top] / base:.3f} | {mib(max(x['peak_rss'] for x in got))} |"
        )


if __name__ == "__main__":
    main()
