"""Differential fuzz vectors for src/core/verify/sparseloco-result.ts: real SparseLoCo results from the worker's
own compressor and encoder, many mutations of each and random byte strings, each labelled with whether
python/psyche_worker/sparseloco_codec.decode accepts it. Prints one JSON list of sets, one per configuration.

Usage: python sparseloco_vectors.py SEED COUNT
"""

from __future__ import annotations

import json
import random
import sys

import torch

from psyche_worker import sparseloco_codec as codec

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from codec_vectors import mutate  # noqa: E402

# A matrix, a 1-D prime length over the chunk (one-element chunks), a small dense 1-D tensor, a 3-D expert stack,
# and a matrix whose sides the chunk does not divide (largest divisors).
SHAPES = [("a.weight", (8, 12)), ("b.bias", (13,)), ("c.norm", (4,)), ("d.experts", (2, 4, 6)), ("e.weight", (10, 9))]
CONFIGS = [(4, 4, 2, False), (4, 6, 3, False), (8, 2, 1, True), (3, 9, 8, False)]
"""(chunk, topk, value_bits, dct)."""


def accepts(data: bytes, layouts: list[codec.TensorLayout], value_bits: int, dct: bool, lid: bytes) -> bool:
    try:
        codec.decode(data, layouts, value_bits, dct, lid)
        return True
    except codec.ResultDecodeError:
        return False


def main() -> None:
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    torch.manual_seed(seed)
    out = []
    for chunk, topk, value_bits, dct in CONFIGS:
        layouts = [codec.layout_for(name, shape, chunk, topk) for name, shape in SHAPES]
        lid = codec.layout_id(layouts, value_bits, dct)

        valid = []
        for _ in range(3):
            compressed = [codec.compress(torch.randn(t.shape), t, value_bits, dct) for t in layouts]
            valid.append(codec.encode(compressed, value_bits, dct, lid))
        assert all(accepts(v, layouts, value_bits, dct, lid) for v in valid)
        cases = [{"hex": v.hex(), "ok": True} for v in valid]
        for _ in range(count):
            if rng.random() < 0.05:
                data = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
            else:
                data = mutate(rng, rng.choice(valid))
            cases.append({"hex": data.hex(), "ok": accepts(data, layouts, value_bits, dct, lid)})
        result_format = {"format": "sparseloco", "value_bits": value_bits, "dct": dct, "layout_id": lid.hex(), "tensors": [t.spec() for t in layouts]}
        out.append({"format": result_format, "size": codec.result_size(layouts, value_bits), "cases": cases})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
