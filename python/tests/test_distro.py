"""DisTrO optimizer: chunked DCT, top-k, produce/apply, determinism, delay correction, training."""

import copy
import hashlib
import math
import random
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from psyche_worker.distro import (
    ChunkedDCT,
    DistroConfig,
    DistroOptimizer,
    ResultDecodeError,
    dct_matrix,
    largest_divisor_at_most,
    topk_per_chunk,
)

torch.set_num_threads(1)
# The real Psyche configs the repository ships as fixtures (test/fixtures/psyche-configs).
CONFIGS = Path(__file__).resolve().parents[2] / "test" / "fixtures" / "psyche-configs"


def reference_dct_matrix(n: int) -> np.ndarray:
    """DCT-II with orthonormal scaling, straight from the definition (scipy's norm='ortho'), float64."""
    out = np.zeros((n, n))
    for k in range(n):
        scale = math.sqrt(1 / (4 * n)) if k == 0 else math.sqrt(1 / (2 * n))
        for j in range(n):
            out[k, j] = 2 * scale * math.cos(math.pi * k * (2 * j + 1) / (2 * n))
    return out


def reference_chunked_dct(x: np.ndarray, chunk) -> np.ndarray:
    """Per-chunk loop in float64: [n_chunks, chunk elements], chunks row-major over the grid."""
    if x.ndim == 1:
        d = reference_dct_matrix(chunk[0])
        return np.stack([d @ x[i : i + chunk[0]] for i in range(0, x.shape[0], chunk[0])])
    d_r, d_c = reference_dct_matrix(chunk[0]), reference_dct_matrix(chunk[1])
    out = []
    for r in range(0, x.shape[0], chunk[0]):
        for c in range(0, x.shape[1], chunk[1]):
            out.append((d_r @ x[r : r + chunk[0], c : c + chunk[1]] @ d_c.T).reshape(-1))
    return np.stack(out)


def param_hash(named_params) -> str:
    h = hashlib.sha256()
    for name, p in sorted(named_params, key=lambda np_: np_[0]):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------- DCT and top-k


@pytest.mark.parametrize("n", [1, 2, 6, 10, 16, 64])
def test_dct_matrix_is_orthonormal_and_matches_the_definition(n):
    d = dct_matrix(n).double().numpy()
    np.testing.assert_allclose(d, reference_dct_matrix(n), atol=1e-7)
    np.testing.assert_allclose(d @ d.T, np.eye(n), atol=1e-6)


def test_largest_divisor_at_most():
    assert largest_divisor_at_most(256, 64) == 64
    assert largest_divisor_at_most(32000, 64) == 64
    assert largest_divisor_at_most(40, 16) == 10
    assert largest_divisor_at_most(100, 7) == 5
    assert largest_divisor_at_most(97, 64) == 1  # prime
    assert largest_divisor_at_most(12, 64) == 12  # dimension smaller than the chunk


@pytest.mark.parametrize("shape, limit", [((128, 192), 64), ((96, 40), 16), ((5, 3), 64), ((256,), 64), ((100,), 64)])
def test_chunked_dct_matches_float64_reference_and_round_trips(shape, limit):
    chunk = tuple(largest_divisor_at_most(s, limit) for s in shape)
    x = np.random.default_rng(0).standard_normal(shape)
    transform = ChunkedDCT(shape, chunk)
    coeffs = transform.forward(torch.from_numpy(x).float())
    expected = reference_chunked_dct(x, chunk)
    assert coeffs.shape == expected.shape
    np.testing.assert_allclose(coeffs.double().numpy(), expected, atol=2e-5)
    np.testing.assert_allclose(transform.inverse(coeffs).double().numpy(), x, atol=2e-5)
    # Orthonormal: energy preserved.
    assert abs(float((coeffs.double() ** 2).sum()) - float((x**2).sum())) < 1e-4 * float((x**2).sum())


@pytest.mark.parametrize("shape, chunk", [((128, 192), (64, 64)), ((96, 40), (16, 10)), ((100,), (50,))])
def test_sparse_inverse_equals_dense_inverse(shape, chunk):
    transform = ChunkedDCT(shape, chunk)
    coeffs = transform.forward(torch.randn(shape, generator=torch.Generator().manual_seed(1)))
    indices, values = topk_per_chunk(coeffs, 5)
    dense = torch.zeros_like(coeffs).scatter_(1, indices, values)
    torch.testing.assert_close(transform.inverse_sparse(indices, values), transform.inverse(dense), atol=1e-6, rtol=0)


def test_topk_selects_exactly_the_largest_magnitudes():
    coeffs = torch.randn(50, 4096, generator=torch.Generator().manual_seed(2))
    indices, values = topk_per_chunk(coeffs, 8)
    expected = np.argsort(-np.abs(coeffs.numpy()), axis=1)[:, :8]
    for row in range(coeffs.shape[0]):
        assert set(indices[row].tolist()) == set(expected[row].tolist())
    torch.testing.assert_close(values, torch.gather(coeffs, 1, indices))


# ---------------------------------------------------------------- config


def test_config_from_every_shipped_run_config():
    found = 0
    for path in sorted(CONFIGS.glob("*/state.toml")):
        table = tomllib.loads(path.read_text())
        for key in ("model", "LLM", "optimizer", "Distro"):
            table = table.get(key) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            continue
        cfg = DistroConfig.from_dict(table)
        assert cfg.compression_topk == table["compression_topk"]
        found += 1
    assert found >= 3, f"expected at least 3 DisTrO run configs under {CONFIGS}"


@pytest.mark.parametrize(
    "table, field",
    [
        ({"compression_topk": 8, "compresion_chunk": 64}, "compresion_chunk"),
        ({"compression_chunk": 0}, "compression_chunk"),
        ({"compression_topk": 2.5}, "compression_topk"),
        ({"compression_topk": True}, "compression_topk"),
        ({"compression_decay": 1.5}, "compression_decay"),
        ({"quantize_1bit": "yes"}, "quantize_1bit"),
        ({"clip_grad_norm": -1.0}, "clip_grad_norm"),
        ({"weight_decay": float("nan")}, "weight_decay"),
    ],
)
def test_config_rejects_bad_fields_by_name(table, field):
    with pytest.raises(ValueError, match=field):
        DistroConfig.from_dict(table)


# ---------------------------------------------------------------- produce / apply


class Toy(torch.nn.Module):
    """Linear regression with a 2-D weight (chunked 2-D) and a bias (1-D)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(48, 32)


def toy_data(seed, n=64):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 48, generator=torch.Generator().manual_seed(99)) * 0.3
    x = torch.randn(n, 48, generator=g)
    return x, x @ teacher.T + 0.5


def loss_of(model, seed):
    x, y = toy_data(seed)
    return torch.nn.functional.mse_loss(model.linear(x), y)


def backward(model, seed):
    for p in model.parameters():
        p.grad = None
    loss = loss_of(model, seed)
    loss.backward()
    return float(loss.detach())


CFG = DistroConfig(compression_chunk=16, compression_topk=4, compression_decay=0.9)


def peers_results(n_peers, cfg=CFG, step_seed=0, **kw):
    """Results of n_peers clients on the same model with different data."""
    results = []
    for i in range(n_peers):
        model = Toy()
        opt = DistroOptimizer(list(model.named_parameters()), cfg, **kw)
        backward(model, step_seed * 100 + i)
        results.append(opt.produce(0.01))
    return results


def test_produce_conserves_momentum_sent_plus_residual_equals_lr_grad():
    model = Toy()
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, compression_decay=0.9, quantize_1bit=False)
    opt = DistroOptimizer(list(model.named_parameters()), cfg, delay_correction=False, value_format="fp16")
    backward(model, 0)
    lr = 0.05
    expected = [lr * p.grad.clone() for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    result = opt.produce(lr)
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)  # without delay correction produce leaves parameters alone
    decoded = opt.decode(result)
    for m, exp, tensor, transform in zip(opt.momentum, expected, decoded, opt.transforms):
        assert tensor.indices.shape == (transform.n_chunks, tensor.spec.topk)
        # What was sent (unquantized) + the residual = lr * g; check via the dense coefficients.
        coeffs_exp = transform.forward(exp)
        coeffs_res = transform.forward(m)
        sent = torch.gather(coeffs_exp, 1, torch.from_numpy(tensor.indices))
        assert torch.gather(coeffs_res, 1, torch.from_numpy(tensor.indices)).abs().max() < 1e-6
        np.testing.assert_allclose(tensor.values, sent.double().numpy(), rtol=2e-3, atol=1e-12)
        torch.testing.assert_close(
            transform.inverse(coeffs_res + torch.zeros_like(coeffs_res).scatter_(1, torch.from_numpy(tensor.indices), sent)), exp, atol=1e-6, rtol=1e-4
        )


def test_momentum_decays_between_steps():
    model = Toy()
    cfg = DistroConfig(compression_chunk=16, compression_topk=1, compression_decay=0.5)
    opt = DistroOptimizer(list(model.named_parameters()), cfg, delay_correction=False)
    backward(model, 0)
    opt.produce(0.1)
    residual = [m.clone() for m in opt.momentum]
    for p in model.parameters():
        p.grad = None  # no new gradient: the residual only decays, then the top-k is removed
    opt.produce(0.1)
    for m, r, transform in zip(opt.momentum, residual, opt.transforms):
        coeffs = transform.forward(0.5 * r)
        idx, val = topk_per_chunk(coeffs, 1)
        torch.testing.assert_close(m, 0.5 * r - transform.inverse_sparse(idx, val), atol=1e-7, rtol=1e-5)


def test_apply_is_sign_of_idct_of_per_coefficient_mean():
    results = peers_results(3, DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=False))
    model = Toy()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = DistroOptimizer(list(model.named_parameters()), DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=False))
    decoded = [opt.decode(r) for r in results]
    opt.apply(results, lr=0.01)
    for t, (name, p) in enumerate(model.named_parameters()):
        transform = opt.transforms[t]
        total = np.zeros((transform.n_chunks, transform.chunk_elems))
        count = np.zeros_like(total)
        for d in decoded:
            np.add.at(total, (np.arange(transform.n_chunks)[:, None], d[t].indices), d[t].values)
            np.add.at(count, (np.arange(transform.n_chunks)[:, None], d[t].indices), 1)
        mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        direction = transform.inverse(torch.from_numpy(mean).float())
        nonzero = direction.abs() > 1e-6  # away from float ties
        expected = before[name] - 0.01 * torch.sign(direction)
        assert torch.equal(p.detach()[nonzero], expected[nonzero])
        assert int(nonzero.sum()) > 0.9 * p.numel()


@pytest.mark.parametrize("kw", [{}, {"value_format": "fp16"}, {"value_format": "bf16"}])
def test_apply_is_order_invariant(kw):
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=not kw, weight_decay=0.1)
    results = peers_results(5, cfg, **kw)
    hashes = set()
    rng = random.Random(7)
    for _trial in range(4):
        shuffled = results[:]
        rng.shuffle(shuffled)
        model = Toy()
        opt = DistroOptimizer(list(model.named_parameters()), cfg, **kw)
        opt.apply(shuffled, lr=0.02)
        opt.apply(list(reversed(shuffled)), lr=0.02)  # a second step, still order-independent
        hashes.add(param_hash(model.named_parameters()))
    assert len(hashes) == 1


def test_dense_aggregation_path_agrees_with_sparse_path():
    # 40 peers * topk 4 = 160 coefficients per chunk >= 16 + 16: apply switches to the dense inverse.
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=False)
    results = peers_results(40, cfg)
    model = Toy()
    opt = DistroOptimizer(list(model.named_parameters()), cfg)
    decoded = [opt.decode(r) for r in sorted(results, key=lambda r: hashlib.sha256(r).digest())]
    t = 0  # linear.weight [32, 48] chunk [16, 16]
    transform = opt.transforms[t]
    indices = torch.from_numpy(np.concatenate([d[t].indices for d in decoded], axis=1))
    values = np.concatenate([d[t].values for d in decoded], axis=1)
    assert indices.shape[1] >= sum(transform.chunk)
    keys = indices.numpy() + np.arange(indices.shape[0])[:, None] * transform.chunk_elems
    _, inv, counts = np.unique(keys.reshape(-1), return_inverse=True, return_counts=True)
    weighted = torch.from_numpy(values / counts[inv].reshape(values.shape)).float()
    sparse_direction = transform.inverse_sparse(indices, weighted)
    before = model.linear.weight.detach().clone()
    opt.apply(results, lr=0.01)
    moved = (before - model.linear.weight.detach()) / 0.01
    clear = sparse_direction.abs() > 1e-5
    assert (moved[clear] - torch.sign(sparse_direction)[clear]).abs().max() < 1e-3


def test_apply_rejects_a_bad_result_by_index_and_changes_nothing():
    results = peers_results(3)
    model = Toy()
    opt = DistroOptimizer(list(model.named_parameters()), CFG)
    before = param_hash(model.named_parameters())
    with pytest.raises(ResultDecodeError, match=r"result 1: truncated"):
        opt.apply([results[0], results[1][:-3], results[2]], lr=0.01)
    with pytest.raises(ResultDecodeError, match=r"result 2: value format bf16 does not match the run's 1-bit"):
        opt.apply(results[:2] + peers_results(1, DistroConfig(compression_chunk=16, compression_topk=4, quantize_1bit=False)), lr=0.01)
    other = torch.nn.Linear(48, 16)
    foreign = DistroOptimizer([("linear.weight", other.weight), ("linear.bias", other.bias)], CFG)
    other(torch.randn(2, 48)).sum().backward()
    with pytest.raises(ResultDecodeError, match=r"result 0: .*'linear.weight'.*shape \[16, 48\]"):
        opt.apply([foreign.produce(0.01)], lr=0.01)
    with pytest.raises(ResultDecodeError, match="result 0: must be bytes"):
        opt.apply(["not bytes"], lr=0.01)
    assert param_hash(model.named_parameters()) == before


def test_weight_decay_and_clipping():
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, clip_grad_norm=1.0, weight_decay=0.5)
    model = Toy()
    opt = DistroOptimizer(list(model.named_parameters()), cfg, delay_correction=False)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1000.0)
    result = opt.produce(0.1)
    assert all(torch.equal(p.grad, torch.full_like(p, 1000.0)) for p in model.parameters())  # grads untouched
    # Same as an unclipped optimizer fed the gradient rescaled to norm 1 by hand.
    reference_model = Toy()
    n = sum(p.numel() for p in reference_model.parameters())
    for p in reference_model.parameters():
        p.grad = torch.full_like(p, 1.0 / math.sqrt(n))
    reference = DistroOptimizer(list(reference_model.named_parameters()), DistroConfig(compression_chunk=16, compression_topk=4), delay_correction=False)
    assert reference.produce(0.1) == result
    for m, m_ref in zip(opt.momentum, reference.momentum):
        torch.testing.assert_close(m, m_ref, atol=1e-7, rtol=1e-4)
    before = [p.detach().clone() for p in model.parameters()]
    opt.apply([result], lr=0.1)
    for p, b in zip(model.parameters(), before):
        step = (b * (1 - 0.1 * 0.5) - p.detach()) / 0.1
        assert torch.allclose(step.abs(), torch.ones_like(step), atol=1e-4)  # decay, then a ±lr sign step


# ---------------------------------------------------------------- delay correction


def run_trajectory(steps, delayed, delay_correction, n_peers=1, quantize_1bit=True):
    """n_peers replicas train for `steps`; returns the hash of replica 0 and its final loss.
    delayed: step t's results are applied after step t+1's backward (the network overlaps compute)."""
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, compression_decay=0.9, quantize_1bit=quantize_1bit)
    models = [Toy() for _ in range(n_peers)]
    opts = [DistroOptimizer(list(m.named_parameters()), cfg, delay_correction=delay_correction) for m in models]
    pending = None
    for step in range(steps):
        for i, m in enumerate(models):
            backward(m, step * 10 + i)
        if delayed and pending is not None:
            for o in opts:
                o.apply(pending, lr=0.01)
        results = [o.produce(0.01) for o in opts]
        if delayed:
            pending = results
        else:
            for o in opts:
                o.apply(results, lr=0.01)
    if pending is not None:
        for o in opts:
            o.apply(pending, lr=0.01)
    return (
        param_hash(models[0].named_parameters()),
        float(loss_of(models[0], 12345).detach()),
        torch.cat([p.detach().reshape(-1) for p in models[0].parameters()]),
    )


def test_delay_correction_with_one_peer_reproduces_the_undelayed_trajectory_bit_for_bit():
    exact = run_trajectory(12, delayed=False, delay_correction=False)[0]
    corrected = run_trajectory(12, delayed=True, delay_correction=True)[0]
    stale = run_trajectory(12, delayed=True, delay_correction=False)[0]
    assert corrected == exact
    assert stale != exact


def test_speculation_never_leaks_into_replicated_state():
    results = peers_results(3, step_seed=1)
    producer, observer = Toy(), Toy()
    opt_p = DistroOptimizer(list(producer.named_parameters()), CFG)
    opt_o = DistroOptimizer(list(observer.named_parameters()), CFG)
    backward(producer, 77)
    own = opt_p.produce(0.01)  # speculates: live parameters move
    assert param_hash(producer.named_parameters()) != param_hash(observer.named_parameters())
    assert param_hash(opt_p.committed_parameters()) == param_hash(observer.named_parameters())
    everyone = results + [own]
    opt_p.apply(everyone, lr=0.01)
    opt_o.apply(everyone[::-1], lr=0.01)
    assert param_hash(producer.named_parameters()) == param_hash(observer.named_parameters())


def test_discard_speculation_and_empty_apply_restore_committed_parameters():
    model = Toy()
    opt = DistroOptimizer(list(model.named_parameters()), CFG)
    start = param_hash(model.named_parameters())
    backward(model, 1)
    opt.produce(0.01)
    assert param_hash(model.named_parameters()) != start
    opt.apply([], lr=0.01)
    assert param_hash(model.named_parameters()) == start
    backward(model, 2)
    opt.produce(0.01)
    opt.discard_speculation()
    assert param_hash(model.named_parameters()) == start


def test_state_dict_round_trip_continues_identically():
    model_a = Toy()
    opt_a = DistroOptimizer(list(model_a.named_parameters()), CFG)
    backward(model_a, 1)
    opt_a.apply([opt_a.produce(0.01)], lr=0.01)
    backward(model_a, 2)
    opt_a.produce(0.01)  # leave a speculation pending: the checkpoint must carry the committed params
    state = copy.deepcopy(opt_a.state_dict())
    model_b = copy.deepcopy(model_a)
    opt_b = DistroOptimizer(list(model_b.named_parameters()), CFG)
    opt_b.load_state_dict(state)
    for o, m in ((opt_a, model_a), (opt_b, model_b)):
        backward(m, 3)
        r = o.produce(0.01)
        o.apply([r], lr=0.01)
        o.discard_speculation()
    assert param_hash(model_a.named_parameters()) == param_hash(model_b.named_parameters())
    bad = opt_a.state_dict()
    bad["momentum"]["linear.bias"] = torch.zeros(3)
    with pytest.raises(ValueError, match="momentum tensor 'linear.bias'.*wrong shape"):
        opt_b.load_state_dict(bad)


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("quantize_1bit", [True, False])
def test_two_peers_train_a_toy_regression(quantize_1bit):
    initial = float(loss_of(Toy(), 12345).detach())
    _, final, _ = run_trajectory(50, delayed=True, delay_correction=True, n_peers=2, quantize_1bit=quantize_1bit)
    assert final < 0.5 * initial, (initial, final)


def test_lookahead_gradient_is_closer_to_the_undelayed_gradient_than_the_stale_one():
    """The point of the delay correction: the gradient of step t+1 taken at the speculative
    parameters is closer to the gradient at the true x_{t+1} than the gradient at the stale x_t."""
    n_peers = 4
    cfg = DistroConfig(compression_chunk=16, compression_topk=4, compression_decay=0.9)
    models = [Toy() for _ in range(n_peers)]
    opts = [DistroOptimizer(list(m.named_parameters()), cfg) for m in models]

    def grad_at(params):
        probe = Toy()
        with torch.no_grad():
            for p, v in zip(probe.parameters(), params):
                p.copy_(v)
        backward(probe, 999)
        return torch.cat([p.grad.reshape(-1) for p in probe.parameters()])

    ratios = []
    for step in range(12):
        for i, m in enumerate(models):
            backward(m, step * 10 + i)
        results = [o.produce(0.01) for o in opts]
        speculative = [p.detach().clone() for p in models[0].parameters()]
        stale = [c.clone() for _, c in opts[0].committed_parameters()]
        for o in opts:
            o.apply(results, lr=0.01)
        true_grad = grad_at([p.detach() for p in models[0].parameters()])
        if step >= 2:  # after the lookahead scale has adapted
            ratios.append(float((grad_at(speculative) - true_grad).norm() / (grad_at(stale) - true_grad).norm()))
    assert sum(ratios) / len(ratios) < 0.99, ratios
    assert all(0.0 <= s < 1.0 for s in opts[0].lookahead_scales)  # peers disagree partly: damped lookahead
