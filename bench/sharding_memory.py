"""Memory per rank of a sharded client (python/psyche_worker/sharding.py), for 1 (unsharded), 2 and 4 ranks on CPU
with gloo, and each rank's peak resident memory:

- DisTrO: the bytes of parameters, gradients and DisTrO state (momentum, the committed copy of delay correction, the
  speculation's int8 signs) that each rank holds after two rounds;
- SparseLoCo (`--optimizer sparseloco`): at the last inner AdamW step of the second round (the compute's peak, with
  delay correction's committed copy held), the parameters, gradients, error feedback, the inner AdamW's two moments,
  the committed copy, and every tensor alive in the process (found by the garbage collector: the round's start copy
  that the inner steps hold is among them).

    .venv/bin/python bench/sharding_memory.py [--template llama2-20m] [--ranks 1,2,4] [--optimizer sparseloco] [--json]

Run from the repository root; the numbers go in bench/README.md ("Memory per rank of a sharded client");
test/train/memory-plan-measured.test.ts checks `psyche plan`'s against them (--json: one JSON line of every rank).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

DISTRO = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.999, "compression_chunk": 64, "compression_topk": 8, "quantize_1bit": True}}
SPARSELOCO = {"SparseLoCo": {"inner_steps": 2, "chunk": 64, "topk": 32, "outer_lr": 0.7}}
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


def _live_tensor_bytes() -> int:
    """Every tensor alive in the process that Python can reach (each storage once): plain tensors only (a sharded
    parameter's DTensor wraps a plain local tensor, found on its own), without storages freed in place (FSDP's
    gathered parameters between uses)."""

    def plain(o) -> bool:
        if type(o) not in (torch.Tensor, torch.nn.Parameter) or o.device.type == "meta":
            return False
        try:
            o.untyped_storage().data_ptr()
        except RuntimeError:
            return False
        return True

    return _bytes(o for o in gc.get_objects() if isinstance(o, torch.Tensor) and plain(o))


def _measure(rank: int, world: int, port: int, config: dict, optimizers: list[str], out) -> None:
    """Every optimizer in turn on this rank, each with a model of its own (the previous one freed first)."""
    torch.set_num_threads(1)
    group = None
    if world > 1:
        from psyche_worker.parallel import join_group

        group = join_group(rank, world, port, torch.device("cpu"))
    for optimizer in optimizers:
        got = _measure_one(rank, world, group, config, optimizer)
        gc.collect()
        out.put({"rank": rank, "optimizer": optimizer, **got, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    if world > 1:
        torch.distributed.destroy_process_group()


def _measure_one(rank: int, world: int, group, config: dict, optimizer: str) -> dict:
    from psyche_worker.model import init_model
    from psyche_worker.sharding import Sharding
    from psyche_worker.trainer import Trainer

    sharding = Sharding(rank, world, group.data) if group is not None else None
    trainer = Trainer(init_model(config, 0), torch.device("cpu"), sharding=sharding)
    sparseloco = optimizer == "sparseloco"
    # SparseLoCo: each inner step's rows, one micro-batch a rank
    inner = SPARSELOCO["SparseLoCo"]["inner_steps"]
    micro = max(1, ROWS // inner // world) if sparseloco else max(1, ROWS // world)
    trainer.configure(SPARSELOCO if sparseloco else DISTRO, SCHEDULE, micro_batch=micro, delay_correction=True)
    peer = trainer.optimizer.peers[0]
    seen: dict = {}
    if sparseloco:
        step_adamw = peer.adamw.step

        def measured_step(*args, **kwargs):
            result = step_adamw(*args, **kwargs)
            opt = trainer.optimizer
            if opt._committed is not None:  # the second round: what the inner steps hold at their peak
                moments = [t for st in peer.adamw.state.values() for t in (st["exp_avg"], st["exp_avg_sq"])]
                seen.update(
                    parameters=_bytes(opt.params),
                    gradients=_bytes(_local(p.grad) for p in opt.sources),
                    error_feedback=_bytes(peer.error),
                    inner_adamw_moments=_bytes(_local(m) for m in moments),
                    committed=_bytes(opt._committed),
                    live_tensors=_live_tensor_bytes(),
                )
            return result

        peer.adamw.step = measured_step
    g = torch.Generator().manual_seed(1)
    previous = None
    for step in (1, 2):
        tokens = torch.randint(0, config["vocab_size"], (ROWS, SEQ), generator=g).to(torch.int32)
        trainer.begin_round(tokens, step)
        _, previous = trainer.finish_round(step, None if previous is None else step - 1, [] if previous is None else [previous])
    if sparseloco:
        return seen
    params = [_local(p) for p in trainer.model.parameters()]
    grads = [None if p.grad is None else _local(p.grad) for p in trainer.model.parameters()]
    state = [*peer._momentum, *(peer._committed_buffers or []), *(peer._own_signs or [])]
    return {"parameters": _bytes(params), "gradients": _bytes(grads), "distro_state": _bytes(state)}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def main() -> None:
    import torch.multiprocessing as mp

    from psyche_worker.parallel import free_port

    parser = argparse.ArgumentParser()
    parser.add_argument("--template", default="llama2-20m")
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--optimizer", default="distro", help="distro, sparseloco, or both: distro,sparseloco")
    parser.add_argument("--json", action="store_true", help="one JSON line: every rank's bytes, by rank count and optimizer")
    args = parser.parse_args()
    optimizers = args.optimizer.split(",")
    if not optimizers or any(o not in ("distro", "sparseloco") for o in optimizers):
        parser.error(f"--optimizer {args.optimizer}: expected distro, sparseloco or distro,sparseloco")
    config = json.loads((ROOT / "templates" / args.template / "model" / "config.json").read_text())
    ctx = mp.get_context("spawn")
    measured: dict[int, dict[str, list[dict]]] = {}
    for world in (int(w) for w in args.ranks.split(",")):
        out, port = ctx.Queue(), free_port()
        procs = [ctx.Process(target=_measure, args=(r, world, port, config, optimizers, out)) for r in range(world)]
        for p in procs:
            p.start()
        got = [out.get(timeout=900) for _ in range(world * len(optimizers))]
        for p in procs:
            p.join(timeout=60)
        measured[world] = {o: sorted((r for r in got if r["optimizer"] == o), key=lambda r: r["rank"]) for o in optimizers}
    if args.json:
        print(json.dumps({"template": args.template, "ranks": {str(w): m for w, m in measured.items()}}))
        return
    mib = lambda n: f"{n / 2**20:,.1f}"  # noqa: E731
    if "distro" in optimizers:
        print("| ranks | parameters MiB | gradients MiB | DisTrO state MiB | total MiB (max over ranks) | vs unsharded | peak RSS MiB (max) |")
        print("|---|---|---|---|---|---|---|")
        base = None
        for world, by in measured.items():
            got = by["distro"]
            totals = [r["parameters"] + r["gradients"] + r["distro_state"] for r in got]
            top = max(range(len(got)), key=lambda i: totals[i])
            r = got[top]
            base = base or totals[top]
            print(
                f"| {world} | {mib(r['parameters'])} | {mib(r['gradients'])} | {mib(r['distro_state'])} | {mib(totals[top])} | "
                f"{totals[top] / base:.3f} | {mib(max(x['peak_rss'] for x in got))} |"
            )
    if "sparseloco" in optimizers:
        parts = ["parameters", "gradients", "error_feedback", "inner_adamw_moments", "committed", "live_tensors"]
        print("| ranks | " + " | ".join(f"{p.replace('_', ' ')} MiB" for p in parts) + " | peak RSS MiB (max) |")
        print("|---" * (len(parts) + 2) + "|")
        for world, by in measured.items():
            got = by["sparseloco"]
            r = max(got, key=lambda x: x["live_tensors"])
            print(f"| {world} | " + " | ".join(mib(r[p]) for p in parts) + f" | {mib(max(x['peak_rss'] for x in got))} |")


if __name__ == "__main__":
    main()
