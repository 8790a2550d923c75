"""DisTrO on a device, for bench/gpu.bench.ts: how fast a result is produced (compress) and applied (decompress),
and what share of a training step DisTrO takes, with the worker's own Trainer (python/psyche_worker/trainer.py).

One step of a DisTrO client = forward/backward of its batch (bf16 autocast on CUDA) + apply the previous round's
results + produce this round's result. Timed separately, each after a device synchronize, medians of --repeats
after --warmup steps:

- forward/backward: Trainer.begin_round (micro-batches, gradient accumulation, the gradient norm);
- produce ("compress"): momentum, chunked DCT, top-k, residual, quantize and encode to the wire bytes;
- decode ("decompress"): the wire bytes back to indices and values, on the device;
- apply of P results: decode, sparse inverse DCT, the sign update (P = 1 and P = --peers).

GB/s are fp32 gradient gigabytes (1e9 B) per second. Prints one JSON object.
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

from psyche_worker.model import init_model, resolve_device, resolve_precision  # noqa: E402
from psyche_worker.trainer import Trainer  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--model-config", required=True)
parser.add_argument("--device", default="auto")
parser.add_argument("--precision", default="auto")
parser.add_argument("--seq-len", type=int, default=512)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--peers", type=int, default=4, help="results applied per round in the second apply row")
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--threads", type=int, default=None)
args = parser.parse_args()

if args.threads:
    torch.set_num_threads(args.threads)
device = resolve_device(args.device)
precision = resolve_precision(args.precision, device)
config = json.loads(Path(args.model_config).read_text())
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


times: dict[str, list[float]] = {"forward_backward": [], "produce": [], "decode": [], "apply_1": [], f"apply_{args.peers}": []}
result = b""
for step in range(args.warmup + args.repeats):
    batch = tokens()
    fb = timed(lambda: trainer.begin_round(batch, step))
    # finish_round = apply (nothing in this bench) + produce; produce is timed alone through the optimizer (the next
    # begin_round replaces the round left pending here)
    lr = trainer.schedule(step)
    out: list[bytes] = []
    produce = timed(lambda: out.append(peer.produce(lr)))
    result = out[0]
    decode = timed(lambda: peer.decode(result))
    apply_1 = timed(lambda: peer.apply([result], lr))
    apply_n = timed(lambda: peer.apply([result] * args.peers, lr))
    if step >= args.warmup:
        for key, value in zip(times, (fb, produce, decode, apply_1, apply_n)):
            times[key].append(value)

med = {k: statistics.median(v) for k, v in times.items()}
step_1 = med["forward_backward"] + med["produce"] + med["apply_1"]
step_n = med["forward_backward"] + med["produce"] + med[f"apply_{args.peers}"]
print(
    json.dumps(
        {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": precision,
            "parameters": parameters,
            "tokens_per_step": args.batch * args.seq_len,
            "result_bytes": len(result),
            "seconds": med,
            "compress_gb_per_s": gradient_bytes / med["produce"] / 1e9,
            "decode_gb_per_s": gradient_bytes / med["decode"] / 1e9,
            "decompress_apply_gb_per_s": gradient_bytes / med["apply_1"] / 1e9,
            "distro_share_1_peer": (med["produce"] + med["apply_1"]) / step_1,
            f"distro_share_{args.peers}_peers": (med["produce"] + med[f"apply_{args.peers}"]) / step_n,
            "peers": args.peers,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        }
    )
)
