"""The preallocated key-value cache: the same values as transformers'
DynamicCache through writes, crops and tree compaction, with no copy of the
cache per step."""

from __future__ import annotations

from typing import Any

import pytest
from specdec_rs import models, runner
from specdec_rs.kv_cache import PreallocatedCache, PreallocatedLayer

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def target() -> Any:
    return models.tiny_llama(vocab_size=40, hidden_size=32, num_layers=2, seed=3)


def test_the_same_logits_as_a_dynamic_cache_through_crops_and_compaction(target: Any) -> None:
    from transformers import DynamicCache

    ours = runner.new_cache(target)
    assert isinstance(ours, PreallocatedCache)
    theirs = DynamicCache(config=target.config)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for step in range(12):
            n = 1 + step % 4
            tokens = torch.randint(0, 40, (n,), generator=g)
            a = runner.forward(target, tokens, ours, keep=n)
            b = runner.forward(target, tokens, theirs, keep=n)
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            if step % 3 == 1:  # a rejection: cut back
                runner.crop(ours, ours.get_seq_length() - 1)
                runner.crop(theirs, theirs.get_seq_length() - 1)
            if step % 3 == 2:  # a tree round: keep a path
                length = ours.get_seq_length()
                keep = torch.tensor([*range(length - n), length - 1])
                runner.keep_positions(ours, keep)
                runner.keep_positions(theirs, keep)
            assert ours.get_seq_length() == theirs.get_seq_length()
            for la, lb in zip(ours.layers, theirs.layers, strict=True):
                assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_a_step_writes_in_place_and_the_capacity_doubles() -> None:
    layer = PreallocatedLayer(capacity=4)
    k = torch.arange(2 * 3 * 2 * 5, dtype=torch.float32).reshape(2, 3, 2, 5)
    keys, _ = layer.update(k, k + 1)
    buffer = layer._k
    assert buffer is not None and buffer.shape[-2] == 4
    keys, values = layer.update(k[..., :1, :], k[..., :1, :])
    assert layer._k is buffer and keys.data_ptr() == buffer.data_ptr()  # no copy
    assert layer.get_seq_length() == 3 and torch.equal(values[..., :2, :], k + 1)
    layer.update(k, k)  # 5 > 4: doubled once, the filled part carried over
    assert layer._k is not buffer and layer._k.shape[-2] == 8
    assert torch.equal(layer.keys[..., :2, :], k) and layer.get_seq_length() == 5
    layer.crop(-2)
    assert layer.get_seq_length() == 3 and layer._k.shape[-2] == 8
    with pytest.raises(ValueError, match="negative count"):
        layer.crop(1)


def test_compaction_moves_only_the_entries_after_the_kept_prefix() -> None:
    layer = PreallocatedLayer(capacity=8)
    k = torch.arange(6, dtype=torch.float32).reshape(1, 1, 6, 1)
    layer.update(k, -k)
    layer.keep(torch.tensor([0, 1, 2, 4]))
    assert layer.keys.flatten().tolist() == [0, 1, 2, 4]
    assert layer.values.flatten().tolist() == [0, -1, -2, -4]
    layer.keep(torch.tensor([0, 1, 2]))  # a prefix: nothing moves
    assert layer.keys.flatten().tolist() == [0, 1, 2]
