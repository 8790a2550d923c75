"""Differential fuzz vectors for src/core/verify/result.ts: real DisTrO results from the worker's own
optimizer (sign, bf16 and fp16), many mutations of each and random byte strings, each labelled with
whether python/psyche_worker/distro_codec.decode_result accepts it. Prints one JSON object.

Usage: python codec_vectors.py SEED COUNT
"""

from __future__ import annotations

import json
import random
import sys

import torch

from psyche_worker.distro import DistroConfig, DistroOptimizer
from psyche_worker.distro_codec import ResultDecodeError, VALUE_FORMAT_NAMES, decode_result


def accepts(data: bytes, opt: DistroOptimizer) -> bool:
    try:
        decode_result(data, opt.specs, opt.value_format)
        return True
    except ResultDecodeError:
        return False


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(7)
    if kind == 0 and b:  # flip one bit
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif kind == 1 and b:  # overwrite a byte
        b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 2:  # truncate
        b = b[: rng.randrange(len(b) + 1)]
    elif kind == 3:  # append
        b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
    elif kind == 4 and len(b) > 12:  # flip a bit in the tail (values / padding)
        i = rng.randrange(max(0, len(b) - 16), len(b))
        b[i] ^= 1 << rng.randrange(8)
    elif kind == 5 and len(b) > 2:  # swap two bytes
        i, j = rng.randrange(len(b)), rng.randrange(len(b))
        b[i], b[j] = b[j], b[i]
    else:  # several flips
        for _ in range(rng.randrange(1, 6)):
            if b:
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def main() -> None:
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    torch.manual_seed(seed)
    # 1-D and 2-D tensors, chunks that divide unevenly (largest divisor), topk > chunk for the tiny bias.
    params = [
        ("a.weight", torch.nn.Parameter(torch.randn(12, 10))),
        ("b.bias", torch.nn.Parameter(torch.randn(3))),
        ("c.weight", torch.nn.Parameter(torch.randn(20, 8))),
    ]
    out = []
    for quantize, value_format in ((True, "bf16"), (False, "bf16"), (False, "fp16")):
        cfg = DistroConfig(compression_chunk=4, compression_topk=3, quantize_1bit=quantize)
        opt = DistroOptimizer(params, cfg, delay_correction=False, value_format=value_format)
        valid = []
        for _ in range(3):
            for _, p in params:
                p.grad = torch.randn_like(p)
            valid.append(opt.produce(0.1))
        cases = [{"hex": v.hex(), "ok": True} for v in valid]
        for _ in range(count):
            if rng.random() < 0.05:
                data = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
            else:
                data = mutate(rng, rng.choice(valid))
            cases.append({"hex": data.hex(), "ok": accepts(data, opt)})
        out.append(
            {
                "format": {
                    "value_format": VALUE_FORMAT_NAMES[opt.value_format],
                    "tensors": [{"name": s.name, "shape": list(s.shape), "chunk": list(s.chunk), "topk": s.topk} for s in opt.specs],
                },
                "cases": cases,
            }
        )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
