"""SparseLoCo's compressor against vectors derived from τemplar's own code (fixtures/templar_vectors.json, written by
fixtures/gen_templar_vectors.py running one-covenant/templar@142666f0 src/tplr/compress.py and neurons.py): the same
input gives the same index set per chunk, the same codes, and the same decoded values within float error; so do the
error feedback update and the outer step (norm clipping, the per-position mean, the SGD step's direction)."""

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from psyche_worker import sparseloco_codec as codec

VECTORS = json.loads((Path(__file__).parent / "fixtures" / "templar_vectors.json").read_text())
MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def sample(seed: int, shape: list[int], scale_log2: int) -> torch.Tensor:
    """The generator the vectors' inputs came from (exact float32: 24-bit fractions times a power of two)."""
    n = math.prod(shape)
    ints = [(splitmix64((seed << 32) + i) >> 40) - (1 << 23) for i in range(n)]
    return torch.tensor(ints, dtype=torch.float64).mul_(2.0 ** (scale_log2 - 24)).to(torch.float32).reshape(shape)


def floats(b64: str, shape: list[int]) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(b64), dtype=np.float32).copy()).reshape(shape)


def indices_of(c: codec.Compressed) -> list[list[int]]:
    t = c.layout
    if c.indices is None:
        return [list(range(t.chunk_elems)) for _ in range(t.n_chunks)]
    return c.indices.tolist()


def test_the_vectors_name_their_source():
    assert VECTORS["source"].startswith("one-covenant/templar@142666f0dd91888dd1e240c38860e042f0364d45")


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_same_indices_codes_and_decoded_values_as_templar(case):
    x = sample(case["input_seed"], case["shape"], -6)
    layout = codec.layout_for("x", tuple(case["shape"]), case["chunk"], case["topk"])
    ours = codec.compress(x, layout, case["value_bits"], case["dct"])
    assert indices_of(ours) == case["indices"]
    assert ours.codes.reshape(layout.n_chunks, -1).tolist() == case["codes"]
    np.testing.assert_allclose(ours.levels.numpy(), np.array(case["levels"], dtype=np.float32), rtol=2e-6, atol=1e-9)
    decoded = ours.values().reshape(-1)[: len(case["decoded"])].numpy()
    np.testing.assert_allclose(decoded, np.array(case["decoded"], dtype=np.float32), rtol=2e-6, atol=1e-9)


def test_error_feedback_as_templar():
    f = VECTORS["error_feedback"]
    error = sample(f["error_seed"], f["shape"], -6)
    delta = sample(f["delta_seed"], f["shape"], -6)
    layout = codec.layout_for("x", tuple(f["shape"]), f["chunk"], f["topk"])
    error.mul_(f["decay"]).add_(delta)
    sent = codec.compress(error, layout, f["value_bits"], False)
    assert indices_of(sent) == f["indices"] and sent.codes.tolist() == f["codes"]
    error.sub_(codec.transmitted(sent, False))
    np.testing.assert_allclose(error.numpy(), floats(f["after"], f["shape"]).numpy(), rtol=1e-5, atol=1e-8)


def test_the_outer_step_clips_to_the_median_norm_and_averages_per_position_as_templar():
    o = VECTORS["outer"]
    for i, t in enumerate(o["tensors"]):
        layout = codec.layout_for(f"t{i}", tuple(t["shape"]), o["chunk"], o["topk"])
        results = []
        for peer in t["peers"]:
            indices = None if layout.dense else torch.tensor(peer["indices"], dtype=torch.int64)
            codes = torch.tensor(peer["codes"], dtype=torch.int64).reshape(layout.n_chunks, -1)
            results.append([codec.Decoded(layout, indices, codes, torch.tensor(peer["levels"], dtype=torch.float32))])
        (direction,) = codec.aggregate(results, o["value_bits"], False)
        expected = floats(t["direction"], t["shape"])
        np.testing.assert_allclose(direction.numpy(), expected.numpy(), rtol=1e-5, atol=1e-9)
        # the three peers' norms differ by 2x and 4x: the two larger ones were scaled down to the median
        assert float(direction.abs().max()) < float(max(max(abs(v) for v in p["levels"]) for p in t["peers"]))


def test_where_templar_fails_we_do_not():
    """τemplar's clamp of top-k to at least 2 makes torch.topk raise on a chunk of one element (a 1-D tensor of
    prime length above the chunk): here such a tensor is sent whole, its codes only."""
    layout = codec.layout_for("prime", (67,), 64, 64)
    assert layout.chunk == (1,) and layout.topk == 1 and layout.dense
    x = sample(7, [67], -6)
    c = codec.compress(x, layout, 2, False)
    assert c.codes.numel() == 67
