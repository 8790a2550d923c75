"""The baseline for bench/train.bench.ts and bench/gpu.bench.ts: a plain PyTorch training loop (no worker, no
ZeroMQ, no TypeScript), same model (any causal LM transformers builds from the config.json), batch shape, optimizer
and threads as `psyche train` on the demo corpus.
On CUDA it is the loop one would write: model and batch on the GPU, bf16 autocast (--precision bf16), fused AdamW.
Prints one JSON object: per-step wall seconds, per-step CPU seconds of the process (all its threads) and tokens."""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--model-config", required=True)
parser.add_argument("--tokens", required=True, help="uint16 token file")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--total-batch", type=int, default=16)
parser.add_argument("--micro-batch", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=128)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--device", default="cpu")
parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
args = parser.parse_args()
device = torch.device(args.device)
cuda = device.type == "cuda"


def sync() -> None:
    if cuda:
        torch.cuda.synchronize(device)


torch.set_num_threads(args.threads)
torch.manual_seed(0)
config = json.load(open(args.model_config))
fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields), dtype=torch.float32).to(device)
decay = [p for p in model.parameters() if p.ndim >= 2]
no_decay = [p for p in model.parameters() if p.ndim < 2]
opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True if cuda else None
)
data = np.memmap(args.tokens, dtype="<u2", mode="r")
rng = np.random.default_rng(0)
S = args.seq_len
step_seconds, step_cpu_seconds, losses = [], [], []
for step in range(args.steps):
    starts = rng.integers(0, len(data) - S - 1, size=args.total_batch)
    batch = torch.from_numpy(np.stack([data[s : s + S + 1].astype(np.int64) for s in starts]))
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    batch = batch.to(device, non_blocking=True)
    model.train()
    opt.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for i in range(0, args.total_batch, args.micro_batch):
        micro = batch[i : i + args.micro_batch]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(input_ids=micro[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), micro[:, 1:].reshape(-1))
        (loss * micro.shape[0] / args.total_batch).backward()
        total += loss.detach() * micro.shape[0]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    loss_value = float(total) / args.total_batch  # one sync per step, as psyche's worker reports its loss
    sync()
    step_seconds.append(time.perf_counter() - t0)
    step_cpu_seconds.append(time.process_time() - c0)
    losses.append(loss_value)
print(
    json.dumps(
        {
            "step_seconds": step_seconds,
            "step_cpu_seconds": step_cpu_seconds,
            "tokens_per_step": args.total_batch * S,
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "parameters": sum(p.numel() for p in model.parameters()),
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        }
    )
)
