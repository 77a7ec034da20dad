"""`Constraint`: one generation's grammar state, which the decoder's rounds
read and advance. p = target, q = draft, k = γ.

A round with drafts x_0..x_{n-1} (`Constraint.walk`): the mask m_0 of the
current state; each draft x_i that m_i allows is consumed and the next mask
m_{i+1} computed. The walk stops at the first draft its mask refuses (target
row i is masked there, so p_i(x_i) = 0 and the verifier rejects x_i with
certainty: no later row is read) or after an EOS draft (nothing after an
EOS is emitted). After verification (`Constraint.settle`) the matcher is
rolled back past the kept drafts and consumes the round's last token, so
the next round starts from exactly the emitted text. An EOS is never
consumed (it ends the text; llguidance does not count an EOS consumed
after the grammar stopped, so a rollback across one would undo a token too
many).

The masks are llguidance's (one bit per token id); an id the tokenizer does
not have (a padded LM head) is never allowed, and EOS only where the grammar
accepts.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from specdec_rs import _core
from specdec_rs.processors import Sampler
from specdec_rs.structured.grammar import Grammar

if TYPE_CHECKING:
    import torch
    from llguidance import LLMatcher, LLTokenizer

FORCED_SOURCE = "grammar"  # the `source` of a round whose drafts the grammar forced
MAX_FORCED = 16  # forced drafts in one round at most (a forward of 17 positions)
# tokenizer -> {(vocab, eos): its llguidance form}; preparing one takes about a second
_PREPARED: weakref.WeakKeyDictionary[Any, dict[tuple[int, tuple[int, ...]], Any]] = (
    weakref.WeakKeyDictionary()
)


class GrammarDeadEnd(ValueError):
    """The grammar allows no token of this tokenizer at this point (e.g. it
    requires a byte no token holds): the request's grammar cannot be
    followed by this model, whatever is sampled. The server answers it
    with a 400."""


@dataclass(frozen=True)
class Walk:
    """A round's drafts as the grammar reads them.

    allowed: (consumed + 1, V) bool, row i the tokens allowed at the
    round's position i. consumed: drafts the matcher consumed (all allowed,
    none an EOS; the tail included). refused: the index of the first draft
    refused, or None. eos: the walk ended at an allowed EOS draft (index
    consumed). tail: the tokens the grammar forces after the last draft
    (consumed too), to run as further drafts with a one-hot q.
    """

    allowed: npt.NDArray[np.bool_]
    consumed: int
    refused: int | None
    eos: bool = False
    tail: tuple[int, ...] = ()

    @property
    def useful(self) -> int:
        """Drafts worth running: those consumed, and the refused one (whose
        rejection still draws the round's last token from its row) or the
        EOS; none after."""
        return self.consumed + (self.refused is not None or self.eos)


class Constraint:
    """The matcher of one generation (one batch row) over a vocabulary of V
    ids, with its EOS ids. Build one with `bind`."""

    def __init__(self, matcher: LLMatcher, vocab: int, eos: frozenset[int]):
        self.matcher, self.vocab, self.eos = matcher, vocab, eos
        self._check("the grammar")

    @property
    def accepting(self) -> bool:
        """The text so far is a complete match (an EOS may follow)."""
        return bool(self.matcher.is_accepting())

    @property
    def stopped(self) -> bool:
        """Only an EOS may follow."""
        return bool(self.matcher.is_stopped())

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next (its only
        tokenization of the bytes it allows next), [] when it allows a choice."""
        if limit <= 0 or self.stopped:
            return []
        return [int(t) for t in self.matcher.compute_ff_tokens()[:limit]]

    def mask(self) -> npt.NDArray[np.bool_]:
        """(V,) bool: the tokens allowed next."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        self._check("computing the mask")
        return np.unpackbits(bits, bitorder="little")[: self.vocab].astype(bool)

    def walk(self, drafts: Sequence[int], tail: int = 0) -> Walk:
        """The masks along `drafts` (see the module docs); the matcher keeps
        the consumed drafts until `settle`. When every draft (one at least)
        was consumed, up to `tail` tokens the grammar then forces follow
        them (`Walk.tail`)."""
        rows = [self.mask()]
        consumed, refused, eos = 0, None, False
        for x in drafts:
            if not rows[-1][x]:
                refused = consumed
                break
            if x in self.eos:
                eos = True
                break
            self._consume(x, "a draft")
            consumed += 1
            rows.append(self.mask())
        forced: list[int] = []
        if drafts and consumed == len(drafts):
            for x in self.forced(tail):
                if not rows[-1][x] or x in self.eos:
                    break
                self._consume(x, "a forced draft")
                forced.append(x)
                rows.append(self.mask())
        return Walk(np.stack(rows), consumed + len(forced), refused, eos, tuple(forced))

    def settle(self, walk: Walk, emitted: Sequence[int]) -> None:
        """After the round's verification: `emitted` is its kept drafts and
        one more token. Roll back the drafts not kept, consume the last
        token (unless a kept EOS ended the text). RuntimeError when the last
        token is not one its row allowed (a masking defect, never the input's)."""
        kept = len(emitted) - 1
        if walk.eos and kept > walk.consumed:  # the EOS draft kept: the text ends there
            return
        if kept > walk.consumed:
            raise RuntimeError(
                f"the round kept {kept} drafts but the grammar consumed {walk.consumed}"
            )
        if kept < walk.consumed and not self.matcher.rollback(walk.consumed - kept):
            self._check("rolling back")
        last = int(emitted[-1])
        if not walk.allowed[kept][last]:
            raise RuntimeError(
                f"token {last} was emitted at round position {kept}, where the grammar "
                "does not allow it: its row was not masked"
            )
        if last not in self.eos:
            self._consume(last, "the emitted token")

    def _consume(self, token: int, what: str) -> None:
        """Consume a token the mask allowed (or the grammar forced). The
        library refuses one only where the text it requires has no
        tokenization (its mask and forced tokens then skip the missing
        bytes): a dead end."""
        if not self.matcher.consume_token(int(token)):
            self._check(f"consuming {what} {token}")
            raise GrammarDeadEnd(f"the grammar refused {what} {token} its own mask allowed")

    def _check(self, when: str) -> None:
        if self.matcher.is_error():
            error = self.matcher.get_error().strip()
            reason = error.splitlines()[0] if error else "no message"
            if reason == "NoExtensionBias":
                reason = "no token of the tokenizer can continue the text the grammar allows"
            raise GrammarDeadEnd(
                f"the grammar failed while {when}: {reason}; the text it requires here has "
                "no tokenization in this model's vocabulary (e.g. a character no token holds)"
            )


class GrammarSampler(Sampler):
    """The sampler a drafter draws through under a grammar (q masked like p).

    probs(logits) of one full-vocabulary row (1, V') masks it to the tokens
    the grammar allows after the text and the drafts drawn so far; draw()
    of that row advances the grammar by the drawn token (an EOS ends the
    advance). Rows of another shape (several at once, a head's reduced
    vocabulary) pass unmasked. Whatever it masks, each q row it returns is
    the law its draft was drawn from, so verification stays exact; the mask
    only keeps the drafter from spending drafts the target must reject.
    `undo` rolls back what it consumed (the decoder's walk then reads the
    proposal from the state before it). `unmasked`: the sampler it wraps.
    """

    def __init__(self, sampler: Sampler, constraint: Constraint):
        super().__init__(sampler.config, sampler.vocab_size, sampler.generator)
        self._flags = sampler._flags  # deferred checks reach the round's sampler
        self.unmasked, self.constraint = sampler, constraint
        self.consumed = 0
        self._last: torch.Tensor | None = None
        self._ended = False

    def probs(self, logits: torch.Tensor, name: str = "logits") -> torch.Tensor:
        full = logits.dim() == 2 and logits.shape[0] == 1 and logits.shape[1] >= self.vocab_size
        if not full or self._ended:
            return super().probs(logits, name)
        allowed = self.constraint.mask()[None]
        out = super().probs(masked_logits(logits, allowed, self.vocab_size), name)
        self._last = out
        return out

    def draw(
        self, probs: torch.Tensor, *, greedy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, q = super().draw(probs, greedy=greedy)
        if probs is self._last and not self._ended:
            self._last = None
            token = int(tokens[0])
            if token in self.constraint.eos:
                self._ended = True  # never consumed (see the module docs)
            else:
                self.constraint._consume(token, "a draft being drawn")
                self.consumed += 1
        return tokens, q

    def undo(self) -> None:
        """Roll the grammar back to where the proposal started."""
        if self.consumed and not self.constraint.matcher.rollback(self.consumed):
            self.constraint._check("rolling back a draft's masks")
        self.consumed = 0


def prepared(tokenizer: Any, vocab: int, eos: Iterable[int]) -> LLTokenizer:
    """The llguidance form of a transformers fast tokenizer over `vocab` ids
    with these EOS ids; cached per tokenizer object (preparing one takes
    about a second)."""
    key = (int(vocab), tuple(sorted(set(eos))))
    try:
        cache = _PREPARED.setdefault(tokenizer, {})
    except TypeError:  # an object without weak references: prepared each time
        cache = {}
    if key not in cache:
        cache[key] = _prepare(tokenizer, *key)
    out: LLTokenizer = cache[key]
    return out


def _prepare(tokenizer: Any, vocab: int, eos: tuple[int, ...]) -> LLTokenizer:
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(
            f"tokenizer is a {type(tokenizer).__name__}; a grammar needs a transformers fast "
            "tokenizer (PreTrainedTokenizerFast, e.g. AutoTokenizer.from_pretrained(path))"
        )
    import llguidance.hf

    out: LLTokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(eos))
    return out


def bind(grammar: Grammar, tokenizer: Any, vocab: int, eos: Iterable[int]) -> Constraint:
    """A new `Constraint` for one generation: `grammar` over `tokenizer`'s
    tokens (ids 0..vocab-1), ending with one of the `eos` ids."""
    from llguidance import LLMatcher

    if not isinstance(grammar, Grammar):
        raise ValueError(
            f"grammar is a {type(grammar).__name__}; expected a specdec_rs.structured.Grammar "
            "(e.g. Grammar.json_schema(schema) or Grammar.regex(r'...'))"
        )
    eos = frozenset(int(t) for t in eos)
    if not eos:
        raise ValueError(
            "a grammar needs an EOS id to end on (eos_token_id = []): pass the model's EOS ids"
        )
    matcher = LLMatcher(prepared(tokenizer, vocab, eos), grammar.llguidance_grammar, log_level=0)
    return Constraint(matcher, vocab, eos)


def masked_logits(logits: Any, allowed: npt.NDArray[np.bool_], vocab: int) -> Any:
    """(n, V') logits -> (n, vocab): the first len(allowed) rows with the
    disallowed ids at −inf (the constrained target before its processors);
    later rows, which the round never reads, unchanged."""
    import torch

    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2:
        # one select a value in Rust (torch's masked_fill: about 0.1 ms a row of 49,152)
        rows = np.ascontiguousarray(logits.detach().numpy())
        flags = np.ascontiguousarray(allowed, bool)
        return torch.from_numpy(_core.masked_logits(rows, flags, vocab))
    return masked_logits_torch(logits, allowed, vocab)


def masked_logits_torch(logits: Any, allowed: npt.NDArray[np.bool_], vocab: int) -> Any:
    """`masked_logits` by torch's `masked_fill` (logits on any device; the
    same values as the Rust select, at about 0.1 ms a CPU row of 49,152)."""
    import torch

    out = logits[..., :vocab].clone()
    m = len(allowed)
    refused = torch.from_numpy(~allowed).to(out.device)
    out[:m] = out[:m].masked_fill(refused, float("-inf"))
    return out
