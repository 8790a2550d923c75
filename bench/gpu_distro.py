"""DisTrO on a device, for bench/gpu.bench.ts and bench/gpu-check.sh: how fast a result is produced (compress) and
how fast P results are applied (decompress), and what share of a training step DisTrO takes, with the worker's own
Trainer (python/psyche_worker/trainer.py).

One step of a DisTrO client = forward/backward of its batch (bf16 autocast on CUDA) + apply the previous round's
results + produce this round's result. Timed separately, each after a device synchronize, medians of --repeats
after --warmup steps:

- forward/backward: Trainer.begin_round (micro-batches, gradient accumulation, the gradient norm);
- produce ("compress"): momentum, chunked DCT, top-k, residual, quantize and encode to the wire bytes, and the
  speculative (lookahead) update;
- decode ("decompress"): the wire bytes of one result back to indices and values;
- apply of P distinct results, for each P of --peers: decode, aggregate, inverse DCT, the sign update (each apply
  after a produce, so it also resolves the speculation and fits the lookahead scales, as in a round).

The P results are distinct: the first is this client's own, the others are produced by a second optimizer over the
same parameters from random gradients (so they share fewer coefficients than real peers' results would: the
aggregation's worst case). GB/s are fp32 gradient gigabytes (1e9 B) per second. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from psyche_worker import reuse_freed_memory  # noqa: E402
from psyche_worker.distro import DistroOptimizer  # noqa: E402
from psyche_worker.model import init_model, resolve_device, resolve_precision  # noqa: E402
from psyche_worker.trainer import Trainer  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model-config", required=True)
parser.add_argument("--device", default="auto")
parser.add_argument("--precision", default="auto")
parser.add_argument("--seq-len", type=int, default=512)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--peers", default="1,4", help="comma-separated numbers of distinct results applied per round")
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--threads", type=int, default=None)
args = parser.parse_args()

if args.threads:
    torch.set_num_threads(args.threads)
reuse_freed_memory()  # as the worker process does
device = resolve_device(args.device)
precision = resolve_precision(args.precision, device)
config = json.loads(Path(args.model_config).read_text())
peer_counts = sorted({int(p) for p in str(args.peers).split(",") if p.strip()} | {1})
# the demo template's DisTrO settings (templates/tiny-demo/state.toml): top-8 of 64x64 chunks, 1-bit values
distro = {"Distro": {"clip_grad_norm": 1.0, "compression_decay": 0.96, "compression_chunk": 64, "compression_topk": 8, "quantize_1bit": True}}

trainer = Trainer(init_model(config, 0), device, precision=precision)
trainer.configure(distro, {"Constant": {"base_lr": 1e-3}}, micro_batch=args.micro_batch, delay_correction=True)
peer = trainer.optimizer.peers[0]  # the Distro optimizer's one peer (DistroOptimizer): its parts are timed alone
parameters = sum(p.numel() for p in trainer.model.parameters())
gradient_bytes = 4 * parameters
gen = torch.Generator().manual_seed(0)


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def tokens() -> torch.Tensor:
    return torch.randint(0, int(config["vocab_size"]), (args.batch, args.seq_len + 1), generator=gen, dtype=torch.int64).to(torch.int32)


def other_results(n: int) -> list[bytes]:
    """n distinct results of a second client over the same parameters, from random gradients."""
    if n == 0:
        return []
    named = sorted(trainer.model.named_parameters(), key=lambda kv: kv[0])
    other = DistroOptimizer(named, peer.config, delay_correction=False)
    noise = torch.Generator(device=device).manual_seed(1)
    out = []
    for _ in range(n):
        for _, p in named:
            p.grad = torch.randn(p.shape, generator=noise, device=device) * 1e-3
        out.append(other.produce(1e-3))
    for _, p in named:
        p.grad = None
    del other
    return out


others = other_results(max(peer_counts) - 1)
times: dict[str, list[float]] = {"forward_backward": [], "produce": [], "decode": [], **{f"apply_{n}": [] for n in peer_counts}}
result = b""
for step in range(args.warmup + args.repeats):
    batch = tokens()
    fb = timed(lambda: trainer.begin_round(batch, step))
    # finish_round = apply (timed below) + produce; produce is timed alone through the optimizer (the next
    # begin_round replaces the round left pending here)
    lr = trainer.schedule(step)
    out: list[bytes] = []
    produce = timed(lambda: out.append(peer.produce(lr)))
    result = out[0]
    decode = timed(lambda: peer.decode(result))
    applies = []
    for i, n in enumerate(peer_counts):
        if i:  # every apply follows a produce, as in a round (it resolves the speculation, fits the lookahead)
            result = peer.produce(lr)
        results = [result, *others[: n - 1]]
        applies.append(timed(lambda: peer.apply(results, lr)))
    if step >= args.warmup:
        for key, value in zip(times, (fb, produce, decode, *applies)):
            times[key].append(value)

med = {k: statistics.median(v) for k, v in times.items()}


def share(n: int) -> float:
    return (med["produce"] + med[f"apply_{n}"]) / (med["forward_backward"] + med["produce"] + med[f"apply_{n}"])


print(
    json.dumps(
        {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": precision,
            "parameters": parameters,
            "tensors": len(peer.params),
            "tokens_per_step": args.batch * args.seq_len,
            "result_bytes": len(result),
            "seconds": med,
            "compress_gb_per_s": gradient_bytes / med["produce"] / 1e9,
            "decode_gb_per_s": gradient_bytes / med["decode"] / 1e9,
            "decompress_apply_gb_per_s": gradient_bytes / med["apply_1"] / 1e9,
            "peers": peer_counts,
            "apply_ratio_to_1": {str(n): med[f"apply_{n}"] / med["apply_1"] for n in peer_counts},
            "distro_share": {str(n): share(n) for n in peer_counts},
            "distro_share_1_peer": share(1),
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        }
    )
)
