"""Bytes per round of one client's result: SparseLoCo in our wire format (PSSL v1) against τemplar's format for the
same compression, and against DisTrO's result, for the templates' models. Sizes only (every result of a layout has
one size), so nothing is trained: the shapes come from each template's config.json on the meta device.

Run: npm run bench -- sparseloco   (or PYTHONPATH=python .venv/bin/python bench/sparseloco_bytes_bench.py)

* ours: sparseloco_codec.result_size at τemplar's settings (chunk 64, top-64, 2-bit values, no DCT).
* τemplar (one-covenant/templar@142666f0, src/tplr/compress.py): per tensor the chunk-wise top-k indices packed in
  12 bits, one uint8 per 2-bit code, and the quantization parameters (a 2^b float32 lookup table, shift, scale); its
  1-D tensors are chunked like ours (chunks of at most 64 elements, top-64: every element, each with an index). This
  is the payload only: the miner uploads it as torch.save of those tensors, which adds pickle framing
  (python/tests/fixtures/templar_vectors.json measured both on the tiny demo's shapes by running τemplar's code:
  84,903 B saved, 59,788 B payload; this script's payload formula is checked against the latter).
* DisTrO: distro_codec.result_layout for the template's DisTrO settings (chunk 64, top-8, 1-bit signs).

Per token: a SparseLoCo round trains H global batches, a DisTrO round one; so at the same global batch a client
sends ours / H against DisTrO's per global batch.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from psyche_worker import sparseloco_codec as codec  # noqa: E402
from psyche_worker.chunked import chunk_for  # noqa: E402
from psyche_worker.distro_codec import TensorSpec, result_layout  # noqa: E402
from psyche_worker.model import _config_from_dict  # noqa: E402

CHUNK, TOPK, VALUE_BITS = 64, 64, 2
DISTRO_CHUNK, DISTRO_TOPK = 64, 8
H = (30, 20, 8)
"""τemplar's H = 30, the tiny-sparseloco template's 20 (bench/README.md, DisTrO convergence), and 8."""


def shapes(template: str) -> list[tuple[str, tuple[int, ...]]]:
    config = json.loads((ROOT / "templates" / template / "model" / "config.json").read_text())
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config_from_dict(config, None, template))
    return [(n, tuple(p.shape)) for n, p in sorted(model.named_parameters())]


def templar_payload(named: list[tuple[str, tuple[int, ...]]]) -> int:
    total = 0
    for name, shape in named:
        t = codec.layout_for(name, shape, CHUNK, TOPK)
        # τemplar's chunk is [rows/cr, cols/cc, cr*cc] with topk clamped to the chunk: the same k and chunk count
        values = t.n_chunks * t.topk
        total += math.ceil(values * 12 / 8) + values + 4 * (1 << VALUE_BITS) + 4 + 8
    return total


def distro_bytes(named: list[tuple[str, tuple[int, ...]]]) -> int:
    specs = []
    for name, shape in named:
        chunk = chunk_for(shape, DISTRO_CHUNK)
        specs.append(TensorSpec(name, shape, chunk, min(DISTRO_TOPK, math.prod(chunk))))
    return result_layout(specs, 0).size


def main() -> None:
    fixture = json.loads((ROOT / "python" / "tests" / "fixtures" / "templar_vectors.json").read_text())["theirs_demo"]
    demo = shapes("tiny-demo")
    assert sum(math.prod(s) for _, s in demo) == fixture["parameters"]
    assert templar_payload(demo) == fixture["payload_bytes"], (templar_payload(demo), fixture["payload_bytes"])
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; τemplar's payload formula matches the bytes its code produced on the tiny demo's shapes")
    print(
        "\n| model | parameters | ours (PSSL v1) | τemplar payload | τemplar / ours | DisTrO result | "
        + " | ".join(f"ours per global batch, H = {h} / DisTrO" for h in H)
        + " |"
    )
    print("|---|---|---|---|---|---|" + "---|" * len(H))
    for template in ("tiny-demo", "llama2-20m", "llama-1b"):
        named = shapes(template)
        params = sum(math.prod(s) for _, s in named)
        layouts = [codec.layout_for(n, s, CHUNK, TOPK) for n, s in named]
        ours = codec.result_size(layouts, VALUE_BITS)
        theirs = templar_payload(named)
        distro = distro_bytes(named)
        per_token = " | ".join(f"{ours / h / distro:.3f} ({distro * h / ours:.1f}× fewer)" for h in H)
        print(
            f"| {template} | {params:,} | {ours:,} B ({8 * ours / params:.3f} bit/param) | {theirs:,} B ({8 * theirs / params:.3f}) | "
            f"{theirs / ours:.2f}× | {distro:,} B ({8 * distro / params:.3f}) | {per_token} |"
        )
    print(
        f"\nτemplar's torch.save on the tiny demo (measured by running its code): {fixture['torch_save_bytes']:,} B, ours {codec.result_size([codec.layout_for(n, s, CHUNK, TOPK) for n, s in demo], VALUE_BITS):,} B"
    )


if __name__ == "__main__":
    main()
