"""DisTrO on the device: the wire format's vectors, the device decoder against the reference decoder (fuzzed),
tensors of three and more dimensions (fused experts), and bit-identical apply of 64 results in any order, on CPU
and on CUDA where there is one."""

import hashlib
import random

import numpy as np
import pytest
import torch

from psyche_worker.chunked import Group, group_layouts
from psyche_worker.distro import DistroConfig, DistroOptimizer, ResultDecodeError
from psyche_worker.distro_codec import (
    VALUE_BF16,
    VALUE_FP16,
    VALUE_SIGN,
    EncodedTensor,
    TensorSpec,
    decode_result,
    encode_result,
    quantize_values,
    result_layout,
)
from psyche_worker.distro_wire import MAX_RESULTS, WireCodec

torch.set_num_threads(1)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"))]

# A 3-D expert tensor (each expert its own chunks), a 2-D one whose chunk has 100 elements (7 index bits, so
# 100..127 are encodable but out of range) and a 1-D one.
SPECS = [
    TensorSpec("model.layers.0.mlp.experts.gate_up_proj", (4, 6, 8), (1, 3, 4), 3),
    TensorSpec("layer.weight", (20, 30), (10, 10), 3),
    TensorSpec("layer.bias", (12,), (6,), 2),
]
# SHA-256 of the vectors below as the encoder of format version 1 wrote them before the device codec existed
# (the same bytes for 1-D and 2-D tensors as ever; a 3-D tensor in the same layout).
VECTORS = {
    VALUE_SIGN: (192, "3b9d39750c381f1d1a1de4773bb2955ee57c6de482abdf0930c0475712875bf9"),
    VALUE_FP16: (325, "3b62689b27c6bb198a15d2848d40bbc359208b1736f26050d8d3691ad65c929b"),
    VALUE_BF16: (322, "45f0c25d8082df2b275187ac1a6f16caf9ee368ed7a54e019ac6331eb330504f"),
}


def vector_content(value_format):
    rng = np.random.default_rng(10 + value_format)
    out = []
    for spec in SPECS:
        indices = np.stack([rng.permutation(spec.chunk_elems)[: spec.topk] for _ in range(spec.n_chunks)])
        values = (rng.standard_normal((spec.n_chunks, spec.topk)) * 1e-3).astype(np.float32)
        out.append((spec, indices, values))
    return out


def codec(specs=SPECS, device="cpu"):
    groups = group_layouts([(s.shape, s.chunk, s.topk) for s in specs])
    return WireCodec(specs, groups, torch.device(device)), groups


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value_format", [VALUE_SIGN, VALUE_FP16, VALUE_BF16])
def test_format_vectors_from_the_reference_and_the_device_encoder(value_format, device):
    content = vector_content(value_format)
    reference = []
    for spec, indices, values in content:
        payload, exponent, _ = quantize_values(torch.from_numpy(values), value_format)
        reference.append(EncodedTensor(spec, indices, payload, exponent))
    data = encode_result(reference, value_format)
    size, digest = VECTORS[value_format]
    assert (len(data), hashlib.sha256(data).hexdigest()) == (size, digest)
    assert result_layout(SPECS, value_format).size == size
    wire, groups = codec(device=device)
    parts = []
    for g in groups:
        parts.append(tuple(torch.from_numpy(np.concatenate([content[m][i] for m in g.members])).to(device) for i in (1, 2)))
    encoded, readback = wire.encode(value_format, parts)
    assert encoded == data
    # what the sender applies to itself is what a decoder reads back
    decoded = decode_result(data, SPECS, value_format)
    for g, coeff in zip(groups, readback):
        expect = np.concatenate([decoded[m].values for m in g.members])
        np.testing.assert_array_equal(coeff.signed_values()[0].cpu().numpy().reshape(expect.shape), expect)


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(5)
        pos = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[pos] = rng.getrandbits(8)
        elif op == 2:
            b[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4)))
        elif op == 3:
            del b[pos : pos + rng.randint(1, 4)]
        elif len(b) > 8:  # the tail: values and padding
            b[rng.randrange(len(b) - 8, len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


@pytest.mark.parametrize("value_format", [VALUE_SIGN, VALUE_FP16, VALUE_BF16])
def test_device_decoder_accepts_exactly_what_the_reference_accepts(value_format):
    """The reference decoder is the specification: for valid results and thousands of mutations of them, the
    device decoder flags a result iff the reference rejects it, and decodes the same coefficients."""
    wire, groups = codec()
    base = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        tensors = []
        for spec in SPECS:
            indices = np.stack([rng.permutation(spec.chunk_elems)[: spec.topk] for _ in range(spec.n_chunks)])
            payload, exponent, _ = quantize_values(torch.from_numpy(rng.standard_normal((spec.n_chunks, spec.topk)).astype(np.float32)), value_format)
            tensors.append(EncodedTensor(spec, indices, payload, exponent))
        base.append(encode_result(tensors, value_format))
    rng = random.Random(value_format)
    size = result_layout(SPECS, value_format).size
    outcomes = {"accepted": 0, "rejected": 0}
    candidates = base + [mutate(rng, rng.choice(base)) for _ in range(3000)]
    same_size = [c for c in candidates if len(c) == size and c[5] == value_format]  # the device decoder's input
    data = torch.from_numpy(np.frombuffer(b"".join(same_size), dtype=np.uint8).reshape(len(same_size), size).copy())
    coefficients, bad = wire.decode(value_format, data)
    for row, candidate in enumerate(same_size):
        try:
            expected = decode_result(candidate, SPECS, value_format)
        except ResultDecodeError:
            assert bool(bad[row]), f"the device decoder accepted what the reference rejects (candidate {row})"
            outcomes["rejected"] += 1
            continue
        assert not bool(bad[row]), f"the device decoder rejected what the reference accepts (candidate {row})"
        outcomes["accepted"] += 1
        for g, coeff in zip(groups, coefficients):
            np.testing.assert_array_equal(coeff.indices[row].numpy().reshape(-1), np.concatenate([expected[m].indices for m in g.members]).reshape(-1))
            np.testing.assert_array_equal(coeff.signed_values()[row].numpy().reshape(-1), np.concatenate([expected[m].values for m in g.members]).reshape(-1))
    assert outcomes["accepted"] > 3 and outcomes["rejected"] > 100, outcomes


def test_apply_names_the_first_bad_result_whatever_kind_of_bad():
    model = torch.nn.Linear(48, 32)
    opt = DistroOptimizer(list(model.named_parameters()), DistroConfig(compression_chunk=16, compression_topk=4))
    model(torch.randn(4, 48)).sum().backward()
    good = opt.produce(0.01)
    repeated = bytearray(good)
    # the first two (8-bit) indices of chunk 0 made equal: the right length, rejected on the device
    at = result_layout(opt.specs, VALUE_SIGN).regions[0].indices
    repeated[at : at + 2] = bytes([7, 7])
    before = params_hash(model.parameters())
    with pytest.raises(ResultDecodeError, match=r"result 1: .*'weight'\): duplicate index in chunk 0") as device_rejected:
        opt.apply([good, bytes(repeated), good[:-1]], 0.01)
    with pytest.raises(ResultDecodeError, match=r"result 1: truncated") as wrong_length:
        opt.apply([good, good[:-1], bytes(repeated)], 0.01)
    with pytest.raises(ResultDecodeError, match=r"result 2: must be bytes") as not_bytes:
        opt.apply([good, good, 7], 0.01)
    # the index is data (the client drops the result by it), whichever check refused the result
    assert (device_rejected.value.index, wrong_length.value.index, not_bytes.value.index) == (1, 1, 2)
    assert params_hash(model.parameters()) == before


def test_too_many_results_is_a_bad_request_not_one_results_fault(tiny_config):
    from psyche_worker.model import init_model
    from psyche_worker.protocol import WorkerError
    from psyche_worker.trainer import Trainer

    t = Trainer(init_model(tiny_config, 0), torch.device("cpu"))
    t.configure({"Distro": {"compression_chunk": 8, "compression_topk": 2}}, {"Constant": {"base_lr": 1e-2}}, micro_batch=2, delay_correction=True)
    with pytest.raises(WorkerError, match=f"at most {MAX_RESULTS}") as refused:
        t.apply_results([b"x"] * (MAX_RESULTS + 1), 1)
    assert refused.value.kind == "bad_request" and refused.value.fields == {}


# ---------------------------------------------------------------- N-D tensors


def test_expert_tensor_is_chunked_per_expert_like_separate_matrices():
    """A fused [E, R, C] expert tensor gives each expert its own chunks: it produces and applies exactly what E
    separate [R, C] tensors with the same values and gradients do."""
    torch.manual_seed(0)
    experts = torch.nn.Parameter(torch.randn(4, 32, 24))
    experts.grad = torch.randn(4, 32, 24)
    separate = [torch.nn.Parameter(experts.detach()[e].clone()) for e in range(4)]
    for e, p in enumerate(separate):
        p.grad = experts.grad[e].clone()
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, compression_decay=0.9)
    fused = DistroOptimizer([("experts", experts)], cfg)
    split = DistroOptimizer([(f"expert.{e}", p) for e, p in enumerate(separate)], cfg)
    assert fused.specs[0].chunk == (1, 16, 12) and fused.specs[0].n_chunks == 4 * 2 * 2
    assert len(split.groups) == 1  # four tensors of one shape: one group
    r_fused, r_split = fused.produce(0.01), split.produce(0.01)
    d_fused, d_split = fused.decode(r_fused)[0], split.decode(r_split)
    np.testing.assert_array_equal(d_fused.indices, np.concatenate([d.indices for d in d_split]))
    np.testing.assert_array_equal(d_fused.values, np.concatenate([d.values for d in d_split]))
    for e, p in enumerate(separate):
        assert torch.equal(experts.detach()[e], p.detach())  # the speculative step, too
    fused.apply([r_fused], 0.01)
    split.apply([r_split], 0.01)
    for e, p in enumerate(separate):
        assert torch.equal(experts.detach()[e], p.detach())


def test_four_dimensional_tensor_and_scalar():
    conv = torch.nn.Parameter(torch.randn(3, 2, 8, 8))
    conv.grad = torch.randn_like(conv)
    opt = DistroOptimizer([("conv", conv)], DistroConfig(compression_chunk=4, compression_topk=2))
    assert opt.specs[0].chunk == (1, 1, 4, 4)
    before = conv.detach().clone()
    opt.apply([opt.produce(0.01)], 0.01)
    assert not torch.equal(conv.detach(), before)
    with pytest.raises(ValueError, match=r"tensor 'scale': .*scalar"):
        DistroOptimizer([("scale", torch.nn.Parameter(torch.tensor(1.0)))], DistroConfig())


def test_a_tiny_mixture_of_experts_trains_and_stays_bit_identical():
    """transformers' own Qwen3-MoE with fused 3-D experts: two replicas apply the same results in different orders
    and stay bit-identical; the experts move; the loss falls."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
    )
    torch.manual_seed(0)
    models = [transformers.Qwen3MoeForCausalLM(config) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    assert any(p.dim() == 3 for p in models[0].parameters())
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, compression_decay=0.9)
    opts = [DistroOptimizer(sorted(m.named_parameters()), cfg) for m in models]
    data = torch.randint(0, 64, (8, 17), generator=torch.Generator().manual_seed(1))
    experts = models[0].model.layers[0].mlp.experts.gate_up_proj.detach().clone()
    losses = []
    for _ in range(6):
        results = []
        for i, (m, o) in enumerate(zip(models, opts)):
            batch = data[4 * i : 4 * i + 4]
            for p in m.parameters():
                p.grad = None
            loss = m(input_ids=batch[:, :-1], labels=batch[:, 1:]).loss
            loss.backward()
            losses.append(loss.item())
            results.append(o.produce(0.01))
        opts[0].apply(results, 0.01)
        opts[1].apply(results[::-1], 0.01)
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b)
    assert not torch.equal(models[0].model.layers[0].mlp.experts.gate_up_proj.detach(), experts)
    assert losses[-1] < losses[0]


# ---------------------------------------------------------------- 64 results


def params_hash(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def model_on(device, seed=0):
    torch.manual_seed(seed)
    # two tensors of one shape, a 3-D expert tensor, a 1-D one: several groups
    return [
        ("a.weight", torch.nn.Parameter(torch.randn(32, 48, device=device))),
        ("b.weight", torch.nn.Parameter(torch.randn(32, 48, device=device))),
        ("experts", torch.nn.Parameter(torch.randn(3, 16, 24, device=device))),
        ("bias", torch.nn.Parameter(torch.randn(40, device=device))),
    ]


def results_of(n, cfg, device, **kw):
    named = model_on(device)
    producer = DistroOptimizer(named, cfg, delay_correction=False, **kw)
    g = torch.Generator(device=device).manual_seed(5)
    out = []
    for _ in range(n):
        for _, p in named:
            p.grad = torch.randn(p.shape, generator=g, device=device)
        out.append(producer.produce(0.01))
    assert len(set(out)) == n
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, {"value_format": "bf16"}, {"value_format": "fp16"}])
def test_apply_of_64_results_is_bit_identical_in_any_order(device, kw):
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=not kw, weight_decay=0.1)
    results = results_of(64, cfg, device, **kw)
    rng = random.Random(11)
    hashes = set()
    for trial in range(4):
        shuffled = results[:]
        rng.shuffle(shuffled)
        named = model_on(device)
        opt = DistroOptimizer(named, cfg, **kw)
        if trial % 2:  # a replica that speculated with its own result first ends the same
            for _, p in named:
                p.grad = torch.randn_like(p)
            opt.produce(0.01)
        opt.apply(shuffled, lr=0.02)
        opt.apply(rng.sample(results[:3], 3), lr=0.02)  # 3 results: the sparse path, order-independent too
        hashes.add(params_hash(p for _, p in named))
    assert len(hashes) == 1


def test_apply_sums_the_results_in_the_order_of_their_sha256():
    """The canonical order is the SHA-256 of each result's bytes, as it was before apply moved to the device, so
    replicas of either version hold the same bytes. Rounding makes the order of the sum matter only where a sign
    is close to a tie: this looks for such a case (seeds 449 and 727 are ones on x86 CPUs) and checks that apply,
    given the results in any order, equals the update from the results sorted by SHA-256, not by their bytes."""
    cfg = DistroConfig(compression_chunk=8, compression_topk=2)

    def updated(results, order=None):
        p = torch.nn.Parameter(torch.zeros(8, 8))
        opt = DistroOptimizer([("w", p)], cfg)
        if order is None:
            opt.apply(results, 1.0)
        else:
            opt.update_from([torch.zeros(8, 8)], [opt.decode(r) for r in sorted(results, key=order)], 1.0)
        return p.detach().clone()

    for seed in (449, 727, *range(1000)):
        g = torch.Generator().manual_seed(seed)
        p = torch.nn.Parameter(torch.zeros(8, 8))
        producer = DistroOptimizer([("w", p)], cfg, delay_correction=False)
        common = torch.randn(8, 8, generator=g)
        results = []
        for _ in range(3):
            p.grad = common + 0.5 * torch.randn(8, 8, generator=g)
            results.append(producer.produce(1.0))
        by_hash = updated(results, lambda r: hashlib.sha256(r).digest())
        assert torch.equal(updated(results[::-1]), by_hash) and torch.equal(updated(results), by_hash)
        if not torch.equal(updated(results, lambda r: r), by_hash):
            return
    pytest.skip("no three results on this machine whose order of summation changes a sign")


@pytest.mark.parametrize("device", DEVICES)
def test_one_peer_speculation_equals_apply_on_the_device(device):
    cfg = DistroConfig(compression_chunk=16, compression_topk=4)
    speculating, plain = model_on(device), model_on(device)
    o_spec, o_plain = DistroOptimizer(speculating, cfg), DistroOptimizer(plain, cfg, delay_correction=False)
    for (_, a), (_, b) in zip(speculating, plain):
        a.grad = torch.ones_like(a)
        b.grad = torch.ones_like(b)
    r_spec, r_plain = o_spec.produce(0.01), o_plain.produce(0.01)
    assert r_spec == r_plain
    o_plain.apply([r_plain], 0.01)
    assert params_hash(p for _, p in speculating) == params_hash(p for _, p in plain)  # the speculation IS the update
    o_spec.apply([r_spec], 0.01)
    assert params_hash(p for _, p in speculating) == params_hash(p for _, p in plain)


def test_groups_keep_model_order():
    groups = group_layouts([((2, 2), (2, 2), 1), ((3,), (3,), 1), ((2, 2), (2, 2), 1)])
    assert groups == [Group((2, 2), (2, 2), 1, (0, 2)), Group((3,), (3,), 1, (1,))]


def test_a_full_value_run_applies_fp16_and_bf16_results_together():
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=False)
    mixed = results_of(3, cfg, "cpu", value_format="bf16") + results_of(3, cfg, "cpu", value_format="fp16")
    hashes = set()
    for order in (mixed, mixed[::-1]):
        named = model_on("cpu")
        DistroOptimizer(named, cfg, value_format="bf16").apply(order, lr=0.02)
        hashes.add(params_hash(p for _, p in named))
    # one canonical order for both formats together: the SHA-256 of every result, as for one format (the rows of
    # the decoded coefficients: the order of the sum matters only near a tie in sign, too rarely to see here)
    named = model_on("cpu")
    opt = DistroOptimizer(named, cfg, value_format="bf16")
    by_hash = [opt.decode(r) for r in sorted(mixed, key=lambda r: hashlib.sha256(r).digest())]
    for decoded, expected in zip(opt._decode_all(mixed[::-1]), opt._host_coefficients(by_hash)):
        assert torch.equal(decoded.indices, expected.indices) and torch.equal(decoded.signed_values(), expected.signed_values())
    opt.update_from([p.detach().clone() for _, p in named], by_hash, 0.02)
    hashes.add(params_hash(p for _, p in named))
    assert len(hashes) == 1 and params_hash(p for _, p in model_on("cpu")) not in hashes
