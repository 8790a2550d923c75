"""The DisTrO result format: bit-exact round trips, strict validation, fuzzed decoding."""

import random
import struct
import time

import numpy as np
import pytest
import torch

from psyche_worker.distro_codec import (
    FORMAT_VERSION,
    MAGIC,
    VALUE_BF16,
    VALUE_FP16,
    VALUE_SIGN,
    EncodedTensor,
    ResultDecodeError,
    TensorSpec,
    decode_result,
    encode_result,
    pack_indices,
    quantize_values,
    unpack_indices,
)

torch.set_num_threads(1)

# A 2-D tensor whose chunk has a non-power-of-two element count (10*10 = 100 -> 7 index bits, so
# indices 100..127 are encodable but out of range) and a 1-D one.
SPECS = [
    TensorSpec("layer.weight", (20, 30), (10, 10), 3),
    TensorSpec("layer.bias", (12,), (6,), 2),
]


def random_result(specs, value_format, seed=0, scale=1e-3):
    rng = np.random.default_rng(seed)
    tensors, truth = [], []
    for spec in specs:
        indices = np.stack([rng.permutation(spec.chunk_elems)[: spec.topk] for _ in range(spec.n_chunks)])
        values = torch.from_numpy(rng.standard_normal((spec.n_chunks, spec.topk)).astype(np.float32) * scale)
        payload, exponent, decoded = quantize_values(values, value_format)
        tensors.append(EncodedTensor(spec, indices, payload, exponent))
        truth.append((indices, decoded.reshape(spec.n_chunks, spec.topk), values))
    return encode_result(tensors, value_format), truth


@pytest.mark.parametrize("bits", [1, 3, 6, 7, 12, 17])
def test_index_packing_round_trips_and_uses_exactly_the_needed_bits(bits):
    rng = np.random.default_rng(bits)
    for count in (0, 1, 7, 8, 9, 1001):
        indices = rng.integers(0, 2**bits, size=count, dtype=np.int64)
        packed = pack_indices(indices, bits)
        assert len(packed) == (count * bits + 7) // 8
        np.testing.assert_array_equal(unpack_indices(packed, count, bits), indices)


@pytest.mark.parametrize("value_format", [VALUE_SIGN, VALUE_FP16, VALUE_BF16])
def test_round_trip_is_bit_exact(value_format):
    data, truth = random_result(SPECS, value_format, seed=value_format)
    decoded = decode_result(data, SPECS, value_format)
    for tensor, (indices, values, original) in zip(decoded, truth):
        np.testing.assert_array_equal(tensor.indices, indices)
        np.testing.assert_array_equal(tensor.values, values)  # exactly what the encoder said a reader sees
        if value_format == VALUE_SIGN:
            np.testing.assert_array_equal(tensor.values, np.where(original.numpy() < 0, -1.0, 1.0))
        else:
            np.testing.assert_allclose(tensor.values, original.numpy(), rtol=1e-2)
    # Canonical: re-encoding the decoded content gives the same bytes.
    again = []
    for tensor in decoded:
        payload, exponent, _ = quantize_values(torch.from_numpy(tensor.values), value_format)
        again.append(EncodedTensor(tensor.spec, tensor.indices, payload, exponent))
    assert encode_result(again, value_format) == data


def test_size_is_header_plus_packed_bits():
    data, _ = random_result(SPECS, VALUE_SIGN)
    header = 4 + 1 + 1 + 4
    w, b = SPECS
    w_bytes = 2 + len(w.name) + 1 + 16 + 4 + (w.n_chunks * 3 * 7 + 7) // 8 + (w.n_chunks * 3 + 7) // 8
    b_bytes = 2 + len(b.name) + 1 + 8 + 4 + (b.n_chunks * 2 * 3 + 7) // 8 + (b.n_chunks * 2 + 7) // 8
    assert len(data) == header + w_bytes + b_bytes


def test_fp16_exponent_keeps_tiny_momentum_values_precise():
    values = torch.tensor([3e-9, -1.7e-8, 5e-10], dtype=torch.float32)
    _, exponent, decoded = quantize_values(values, VALUE_FP16)
    assert exponent > 20
    np.testing.assert_allclose(decoded, values.numpy(), rtol=1e-3)


def _expect_error(data, match, value_format=None):
    with pytest.raises(ResultDecodeError, match=match):
        decode_result(data, SPECS, value_format)


def test_rejects_bad_magic_version_and_format():
    data, _ = random_result(SPECS, VALUE_SIGN)
    _expect_error(b"XXXX" + data[4:], "bad magic")
    _expect_error(data[:4] + bytes([FORMAT_VERSION + 1]) + data[5:], "unsupported version 2")
    _expect_error(data[:5] + bytes([9]) + data[6:], "unknown value format 9")
    _expect_error(data, "does not match the run's full-value", VALUE_BF16)
    fp16, _ = random_result(SPECS, VALUE_FP16)
    _expect_error(fp16, "does not match the run's 1-bit", VALUE_SIGN)
    decode_result(fp16, SPECS, VALUE_BF16)  # fp16 and bf16 both carry full values


def test_rejects_wrong_tensor_count_name_and_shape():
    data, _ = random_result(SPECS, VALUE_SIGN)
    with pytest.raises(ResultDecodeError, match="result has 2 tensors, the model has 1"):
        decode_result(data, SPECS[:1])
    renamed = [TensorSpec("layer.other", s.shape, s.chunk, s.topk) if i == 0 else s for i, s in enumerate(SPECS)]
    wrong_name, _ = random_result(renamed, VALUE_SIGN)
    _expect_error(wrong_name, r"tensor 0: name 'layer.other' does not match the model's 'layer.weight'")
    reshaped = [SPECS[0], TensorSpec("layer.bias", (18,), (6,), 2)]
    wrong_shape, _ = random_result(reshaped, VALUE_SIGN)
    _expect_error(wrong_shape, r"tensor 1 \('layer.bias'\): shape \[18\] does not match the model's \[12\]")
    rechunked = [TensorSpec("layer.weight", (20, 30), (10, 15), 3), SPECS[1]]
    wrong_chunk, _ = random_result(rechunked, VALUE_SIGN)
    _expect_error(wrong_chunk, r"chunk \[10, 15\] does not match the expected \[10, 10\]")
    more_k = [TensorSpec("layer.weight", (20, 30), (10, 10), 4), SPECS[1]]
    wrong_k, _ = random_result(more_k, VALUE_SIGN)
    _expect_error(wrong_k, "topk 4 does not match the expected 3")


def _with_indices(spec_index, mutate):
    """A valid 1-bit result whose indices of tensor `spec_index` are replaced by mutate(indices)."""
    rng = np.random.default_rng(5)
    tensors = []
    for i, spec in enumerate(SPECS):
        indices = np.stack([rng.permutation(spec.chunk_elems)[: spec.topk] for _ in range(spec.n_chunks)])
        if i == spec_index:
            indices = mutate(indices)
        payload, _, _ = quantize_values(torch.ones(spec.n_chunks * spec.topk), VALUE_SIGN)
        tensors.append(EncodedTensor(spec, indices, payload))
    return encode_result(tensors, VALUE_SIGN)


def test_rejects_out_of_range_and_duplicate_indices():
    def out_of_range(idx):
        idx[2, 1] = 127  # encodable in 7 bits, but the chunk has 100 elements
        return idx

    _expect_error(_with_indices(0, out_of_range), r"'layer.weight'\): index 127 at chunk 2 is out of range")

    def duplicate(idx):
        idx[1, 1] = idx[1, 0]
        return idx

    _expect_error(_with_indices(1, duplicate), r"'layer.bias'\): duplicate index in chunk 1")


def test_rejects_every_truncation_and_trailing_bytes():
    data, _ = random_result(SPECS, VALUE_FP16)
    for cut in range(len(data)):
        with pytest.raises(ResultDecodeError):
            decode_result(data[:cut], SPECS)
    _expect_error(data[:-1], "truncated")
    _expect_error(data + b"\0", "1 trailing bytes")


def test_rejects_nonzero_padding_and_non_finite_values():
    data, _ = random_result(SPECS, VALUE_SIGN)
    # The last tensor's sign bits: 2 chunks * 2 = 4 bits in one byte; set a padding bit.
    _expect_error(data[:-1] + bytes([data[-1] | 0x80]), "nonzero padding bits after the sign bits")
    bf16, _ = random_result(SPECS, VALUE_BF16)
    nan = struct.pack("<H", 0x7FC0)
    _expect_error(bf16[:-2] + nan, "non-finite bf16 value")
    fp16, _ = random_result(SPECS, VALUE_FP16)
    _expect_error(fp16[:-2] + struct.pack("<H", 0x7C00), "non-finite fp16 value")


def test_rejects_non_bytes():
    with pytest.raises(ResultDecodeError, match="must be bytes"):
        decode_result("PSDR", SPECS)


def test_fuzzed_inputs_are_rejected_or_decoded_never_crash():
    rng = random.Random(1234)
    seeds = [random_result(SPECS, fmt, seed=fmt)[0] for fmt in (VALUE_SIGN, VALUE_FP16, VALUE_BF16)]
    header = MAGIC + bytes([FORMAT_VERSION])
    outcomes = {"decoded": 0, "rejected": 0}
    deadline = time.monotonic() + 4.0
    n = 0
    while n < 10000 and time.monotonic() < deadline:
        n += 1
        kind = n % 5
        if kind == 0:  # random bytes, sometimes with a valid-looking header
            body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
            data = (header + bytes([rng.randrange(3)]) + body) if rng.random() < 0.5 else body
        else:
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 4)):
                op = rng.randrange(4)
                pos = rng.randrange(len(data)) if data else 0
                if op == 0 and data:  # flip a bit
                    data[pos] ^= 1 << rng.randrange(8)
                elif op == 1 and data:  # overwrite a byte
                    data[pos] = rng.getrandbits(8)
                elif op == 2:  # insert bytes
                    data[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 8)))
                else:  # delete a range
                    del data[pos : pos + rng.randint(1, 8)]
            data = bytes(data)
        try:
            decoded = decode_result(data, SPECS)
        except ResultDecodeError:
            outcomes["rejected"] += 1
            continue
        outcomes["decoded"] += 1
        for tensor in decoded:  # anything accepted is within the model's layout
            assert tensor.indices.shape == (tensor.spec.n_chunks, tensor.spec.topk)
            assert tensor.indices.min() >= 0 and tensor.indices.max() < tensor.spec.chunk_elems
            assert np.isfinite(tensor.values).all()
    assert n >= 2000, f"only {n} fuzz cases ran in the time budget"
    assert outcomes["rejected"] > 0 and outcomes["decoded"] > 0  # both paths exercised (value-bit flips stay valid)
