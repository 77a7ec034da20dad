"""The prefix cache (`generation.PrefixCache`): a reused prefix gives the
same bits as one computed afresh, alone, in a batch (rows reading a prefix
another row stored while that row still decodes and verifies) and under a
cache too small to hold a prompt; the power of that check against a chain
keyed by a block's tokens alone; the counters; bad input. p = target,
q = draft. The server's side is in test_serve.py."""

from __future__ import annotations

from typing import Any

import pytest
import specdec_rs as sd
import test_batch
from specdec_rs import models
from specdec_rs.engine import BatchEngine, Request
from specdec_rs.generation import PrefixCache
from specdec_rs.generation.prefix import BLOCK, ROOT

torch = pytest.importorskip("torch")
V = test_batch.V
tiny = test_batch.tiny  # the batch tests' tiny target and its GGUF files (f32, q8)
gguf = test_batch.gguf


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(2, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(target: Any, prompt: list[int], t: float, seed: int, n: int = 12, **options: Any) -> Any:
    return sd.generate(
        target, sd.PromptLookup(), prompt, max_new_tokens=n, k=2, temperature=t,
        seed=seed, eos_token_id=[], **options,
    )  # fmt: skip


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_conversation_reuses_its_turns_and_equals_a_fresh_prefill(
    gguf: Any, temperature: float
) -> None:
    """Three turns, each prompt the last turn's prompt, its reply and a new
    message: every turn reuses the whole blocks before it (cached_tokens)
    and gives the tokens a run without the cache gives, bit for bit; the
    same prompt again reuses all its whole blocks."""
    cache = PrefixCache(megabytes=16)
    prompt, hits, queries = tokens(37, 0), 0, 0
    before: list[int] = []
    for turn in range(3):
        fresh = run(gguf, prompt, temperature, turn)
        reused = run(gguf, prompt, temperature, turn, prefix_cache=cache)
        assert reused.tokens == fresh.tokens and fresh.cached_tokens == 0
        # the last turn's sequence is stored but its last token (never run)
        stored = 0 if turn == 0 else (len(before) + 12 - 1) // BLOCK * BLOCK
        assert reused.cached_tokens == stored and (stored > 0 or turn == 0)
        hits, queries = hits + reused.cached_tokens, queries + len(prompt)
        before = prompt
        prompt = prompt + reused.tokens + tokens(9, 10 + turn)
    again = run(gguf, before, temperature, 2, prefix_cache=cache)
    assert again.cached_tokens == (len(before) - 1) // BLOCK * BLOCK
    assert cache.hits == hits + again.cached_tokens
    assert cache.queries == queries + len(before)


def shared_requests(t: float) -> list[Request]:
    head = tokens(48, 1)
    return [
        Request(head + tokens(n, 20 + i), 12, t, seed=30 + i, eos_token_id=[], k=2)
        for i, n in enumerate((5, 17, 1, 30, 9, 40))
    ]


def alone(target: Any, r: Request) -> Any:
    return run(target, r.prompt, r.temperature, r.seed, r.max_new_tokens)


@pytest.mark.parametrize("chunk", [0, 8])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_rows_reading_a_prefix_equal_each_alone(
    gguf: Any, chunk: int, temperature: float
) -> None:
    """Six requests sharing a 48-token head through 2 slots, prefilled alone
    or in chunks: the rows after the first read the head the first stored
    when it was prefilled (while it still decodes and verifies), and every
    row's tokens equal the request alone without a cache."""
    cache = PrefixCache(megabytes=16)
    engine = BatchEngine(gguf, sd.PromptLookup, max_batch=2, k=2, prefix_cache=cache,
                         prefill_chunk=chunk)  # fmt: skip
    rs = shared_requests(temperature)
    out = engine.run(rs)
    for r, f in zip(rs, out.rows, strict=True):
        assert f.result is not None, f.error
        assert f.result.tokens == alone(gguf, r).tokens
    assert out.rows[0].result.cached_tokens == 0
    if chunk == 0:  # prefilled at its join, after row 0's: read while row 0 runs
        assert out.rows[1].result.cached_tokens == 48
    assert all(f.result.cached_tokens >= 48 for f in out.rows[2:])
    assert cache.hits == sum(f.result.cached_tokens for f in out.rows)
    assert cache.queries == sum(len(r.prompt) for r in rs)


class TokensOnly(PrefixCache):
    """Bug: a block is found by its own tokens alone, whatever came before it."""

    @staticmethod
    def _key(parent: int, tokens: list[int]) -> tuple[int, tuple[int, ...]]:
        return (ROOT, tuple(tokens))


def test_the_identity_check_catches_a_block_reused_after_other_tokens(gguf: Any) -> None:
    """Prompts A + C and B + C + D stored, then B + C + E asked: a chain keyed
    by tokens alone reuses C's keys computed after A, and the output parts
    from the fresh run's; the real cache reuses B only and keeps it."""
    a, b, c = tokens(BLOCK, 2), tokens(BLOCK, 3), tokens(BLOCK, 4)
    asked = b + c + tokens(6, 5)
    for kind, same in ((PrefixCache, True), (TokensOnly, False)):
        cache = kind(megabytes=16)
        run(gguf, a + c + tokens(3, 6), 0.0, 1, prefix_cache=cache)
        run(gguf, b + tokens(BLOCK + 3, 7), 0.0, 1, prefix_cache=cache)
        got = run(gguf, asked, 0.0, 1, prefix_cache=cache)
        assert got.cached_tokens == (BLOCK if same else 2 * BLOCK)
        assert (got.tokens == run(gguf, asked, 0.0, 1).tokens) == same


def test_a_tiny_cache_evicts_and_stays_exact(gguf: Any) -> None:
    """A cache of about two blocks: prompts of many blocks evict each other
    (the least recently used first), the bytes stay within the budget, and
    every row still equals its lone run."""
    block_bytes = (
        2
        * len(gguf.model.layers)
        * BLOCK
        * gguf.model.layers[0].kv_heads
        # a row's bytes: 4 or 2 per value (f32, f16), 34 per 32 (q8_0)
        * gguf.model.layers[0].cache_dtype.itemsize
        * gguf.model.layers[0].cache_width
    )
    cache = PrefixCache(megabytes=2.5 * block_bytes / (1 << 20))
    rs = shared_requests(0.8)
    out = BatchEngine(gguf, sd.PromptLookup, max_batch=2, k=2, prefix_cache=cache).run(rs)
    for r, f in zip(rs, out.rows, strict=True):
        assert f.result is not None and f.result.tokens == alone(gguf, r).tokens
    assert 0 < cache.bytes <= cache.budget and len(cache.blocks) == 2
    assert cache.hits > 0


def test_a_drafter_that_reads_hidden_states_computes_its_prompt(gguf: Any) -> None:
    """The cache holds no hidden states: a drafter that reads them at start
    gets the prompt computed (queried, not hit), and its sequence is still stored."""

    class ReadsHidden(sd.PromptLookup):
        needs_target_hidden = True

        def update(self, seq: Any, num_accepted: int, hidden: Any) -> None:
            super().update(seq, num_accepted, None)

    cache = PrefixCache(megabytes=16)
    prompt = tokens(40, 8)
    first = run(gguf, prompt, 0.0, 1, prefix_cache=cache)
    out = sd.generate(gguf, ReadsHidden(), prompt, max_new_tokens=12, k=2, temperature=0,
                      eos_token_id=[], prefix_cache=cache)  # fmt: skip
    assert out.cached_tokens == 0 and out.tokens == first.tokens
    assert cache.queries == 2 * len(prompt) and cache.hits == 0


def test_bad_prefix_caches(gguf: Any, tiny: Any) -> None:
    with pytest.raises(ValueError, match="megabytes"):
        PrefixCache(megabytes=0)
    with pytest.raises(ValueError, match="needs a GGUF target"):
        run(tiny, [1, 2, 3], 0.0, 1, prefix_cache=PrefixCache())
    with pytest.raises(ValueError, match="pass a generation.PrefixCache"):
        BatchEngine(gguf, None, prefix_cache={})  # type: ignore[arg-type]
    cache = PrefixCache()
    run(gguf, [1, 2, 3], 0.0, 1, prefix_cache=cache)
    other = models.tiny_llama(vocab_size=V, hidden_size=64, num_layers=2, seed=1)
    with pytest.raises(ValueError, match="another target"):
        BatchEngine(other, None, prefix_cache=cache)


def test_a_row_prefilling_in_chunks_reads_blocks_another_row_just_computed(gguf: Any) -> None:
    """Two requests of the same 100-token prompt join beside a decoding row,
    16 prompt tokens a round: the first prefills it piece by piece, storing
    each piece's whole blocks; the second, at its first piece, finds all 6
    of the prompt's whole blocks and computes only the 3 positions left.
    Both equal the request alone."""
    engine = BatchEngine(gguf, sd.PromptLookup, max_batch=3, k=2, prefill_chunk=16,
                         prefix_cache=PrefixCache(megabytes=16))  # fmt: skip
    busy = Request(tokens(5, 11), 40, 0.8, seed=1, eos_token_id=[], k=2)
    prompt = tokens(100, 12)
    twins = [Request(prompt, 10, 0.8, seed=2 + i, eos_token_id=[], k=2) for i in range(2)]
    done = {}
    first = engine.submit(busy)
    done.update((f.id, f) for f in engine.step())
    ids = [engine.submit(r) for r in twins]
    while engine.active or engine.queued:
        done.update((f.id, f) for f in engine.step())
    a, b = (done[i].result for i in ids)
    assert a.cached_tokens == 0 and b.cached_tokens == 96
    for r, got in zip(twins, (a, b), strict=True):
        assert got.tokens == alone(gguf, r).tokens
    assert done[first].result.tokens == alone(gguf, busy).tokens
