"""The generation loop: `generate` runs rounds of the `Decoder` until the
budget or an EOS, each round's γ from a policy, and returns the result.
p = target, q = draft, k = γ.

Each round: the drafter proposes k' <= k tokens with the rows q they were drawn
from; one target forward over [last token, drafts] gives p at k'+1 positions;
the Rust `verify` keeps an accepted prefix plus one token; the target cache is
cut to the accepted length (the new last token waits for the next round).
With drafter=None every round is a plain target step through the same code
(the like-for-like baseline). Batch size 1.

>>> import specdec_rs as sd
>>> from specdec_rs.models import tiny_llama
>>> target = tiny_llama(num_layers=2)
>>> out = sd.generate(target, sd.PromptLookup(), [5, 6, 7, 5, 6], max_new_tokens=8,
...                   k=3, temperature=0, eos_token_id=[])
>>> plain = sd.generate(target, None, [5, 6, 7, 5, 6], max_new_tokens=8,
...                     temperature=0, eos_token_id=[])
>>> out.tokens == plain.tokens, out.new_tokens
(True, 8)
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models
from specdec_rs.drafters.base import Members
from specdec_rs.generation.decoder import Decoder
from specdec_rs.generation.inputs import (
    Prompt,
    check_context,
    check_drafter,
    check_tree_drafter,
    eos_set,
    shared_vocab,
)
from specdec_rs.generation.prefix import checked_prefix
from specdec_rs.generation.result import GenerationResult
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.policy import FixedK, KPolicy, as_policy
from specdec_rs.processors import SamplingConfig
from specdec_rs.rounds import Round
from specdec_rs.structured.constraint import MAX_FORCED

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specdec_rs.drafters import Drafter
    from specdec_rs.generation.prefix import PrefixCache
    from specdec_rs.structured import Constraint, Grammar


def generate(
    target: PreTrainedModel,
    drafter: Drafter | None,
    input_ids: Any,
    *,
    max_new_tokens: int,
    k: int | KPolicy = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | Iterable[int] | None = None,
    vocab_size: int | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
    on_round: Callable[[Round], None] | None = None,
    allow_past_context: bool = False,
    transfer: str = "auto",
    tree: Any = None,
    margins: bool = False,
    grammar: Grammar | None = None,
    tokenizer: Any = None,
    prefix_cache: PrefixCache | None = None,
) -> GenerationResult:
    """Sample up to `max_new_tokens` from the target, speculatively.

    The output has exactly the distribution of target-only sampling with the
    same processors (at temperature 0: the target's greedy output). Stops after
    the first EOS (kept) or at the budget. `on_tokens` gets each round's new ids.
    k: drafts per round, or a policy choosing them each round (see `specdec_rs.policy`).
    seed=None draws one (reported in the result); same seed, same output.
    input_ids: one prompt, (n,) or (1, n); batch > 1 is a ValueError.
    A prompt plus max_new_tokens past the target's context
    (config.max_position_embeddings) is a ValueError before any work unless
    allow_past_context=True. Everything a drafter proposes is checked before
    the target runs (at most k ids in [0, V), q of shape (k', V)).
    The models run wherever their weights are (CPU or an accelerator); the
    probabilities reach the Rust verifier in place on the CPU, and elsewhere
    by one small copy per round plus the one or two rows sampled from
    (transfer="gathered" takes that path on the CPU too).
    tree: draft a tree of at most `tree` nodes per round instead of a chain
    (the drafter's `propose_tree`; k is then unused): one target forward over
    all nodes with a tree attention mask, `verify_tree`, and the target cache
    compacted to the accepted path. A tree policy (e.g. `AdaptiveTree`, with
    next_budget(), observe(budget, depth, emitted) and reset()) chooses the
    size each round instead.
    margins=True (temperature 0 only) records the target's logit margin,
    top-1 minus top-2, at each new token (`GenerationResult.margins`), so
    `divergence(a, b)` can say how near a tie two greedy runs parted.
    grammar: constrain the output to a `structured.Grammar` (a JSON schema,
    regex, choice or grammar) over `tokenizer`'s tokens (a transformers
    fast tokenizer; needs the `structured` extra). The output then has
    exactly the law of the target masked to the grammar at each position
    (the mask before the processors), EOS only where the grammar accepts;
    with a drafter, tokens the grammar forces are proposed as free drafts.
    A budget may end the output before the grammar accepts
    (`GenerationResult.grammar_accepting`). Chains only (no tree=).
    prefix_cache: a `generation.PrefixCache` (a GGUF target's): the prompt's
    longest stored prefix is copied into the cache instead of computed (the
    same bits), and the sequence is stored at the end
    (`GenerationResult.cached_tokens`).
    """
    import torch

    models.check_model(target, "target")
    check_drafter(drafter, target)
    config = SamplingConfig(temperature, top_k, top_p, min_p)
    policy = as_policy(k)
    policy.reset()
    max_new = _checks.integer(max_new_tokens, "max_new_tokens", minimum=1, maximum=MAX_NEW_TOKENS)
    seed = secrets.randbits(63) if seed is None else _checks.seed(seed)
    eos = eos_set(eos_token_id, target)
    for name, hook in (("on_tokens", on_tokens), ("on_round", on_round)):
        if hook is not None:
            _checks.function(hook, name)
    allow = _checks.boolean(allow_past_context, "allow_past_context")
    if _checks.boolean(margins, "margins") and config.temperature != 0:
        raise ValueError(
            f"margins=True records greedy margins; temperature = {config.temperature:g}: "
            "pass temperature=0 or margins=False"
        )
    vocab = shared_vocab(target, drafter, vocab_size)
    prompt = Prompt.of(input_ids, vocab)  # checked here, once
    check_context(target, len(prompt), max_new, allow)
    trees = None if tree is None else check_tree_drafter(drafter, tree)
    route = source_router(policy, drafter)
    constraint = constrained(grammar, tokenizer, vocab, eos)
    if constraint is not None and trees is not None:
        raise ValueError("a grammar constrains chains only: drop tree= or the grammar")
    prefix = checked_prefix(prefix_cache, target)
    with torch.inference_mode():
        decoder = Decoder(
            target,
            drafter,
            prompt,
            config,
            seed,
            vocab_size,
            transfer=transfer,
            margins=margins,
            constraint=constraint,
            prefix=prefix,
        )
        run = Run(decoder, policy, trees, route, max_new, eos, on_tokens, on_round)
        while not run.done:
            asked, is_tree = run.ask()
            run.commit(decoder.round(asked, is_tree, run.forced_limit))
        decoder.remember()
    return run.result()


class Run:
    """One generation's loop state around its `Decoder`: what each round
    asks for (γ from the policy, or a tree's budget), and what a finished
    round commits (the policy's observation, the budget and EOS cut, the
    hooks). `generate` drives one; `engine.BatchEngine` drives many, their
    target forwards run together."""

    def __init__(
        self,
        decoder: Decoder,
        policy: KPolicy,
        trees: Any,
        route: Callable[[Any], None] | None,
        max_new: int,
        eos: frozenset[int],
        on_tokens: Callable[[list[int]], None] | None = None,
        on_round: Callable[[Round], None] | None = None,
    ):
        self.decoder, self.policy, self.trees, self.route = decoder, policy, trees, route
        self.max_new, self.eos = max_new, eos
        self.on_tokens, self.on_round = on_tokens, on_round
        self.stop = "length"
        if trees is not None:
            trees.reset()
        else:
            announce_catch_up(policy, decoder.drafter, decoder, max_new)

    @property
    def done(self) -> bool:
        return self.stop == "eos" or self.decoder.generated >= self.max_new

    @property
    def remaining(self) -> int:
        return self.max_new - self.decoder.generated

    @property
    def forced_limit(self) -> int:
        """The most grammar-forced drafts the next round may run (a round
        emits at most drafts + 1 tokens, never past the budget)."""
        return max(0, min(MAX_FORCED, self.remaining - 1))

    def ask(self, k: int | None = None) -> tuple[int, bool]:
        """(what the next round asks for, whether it drafts a tree): a tree's
        budget, or γ capped by the budget (`round_k`); `k` overrides the
        policy's γ (a batch-wide policy's choice)."""
        if self.trees is not None:
            return self.trees.next_budget(), True
        if self.decoder.drafter is None:
            return 0, False
        if self.route is not None:
            self.route(self.decoder.seq)
        want = self.policy.next_k() if k is None else k
        return round_k(want, self.remaining), False

    def commit(self, r: Round) -> None:
        """A finished round: the policy observes it, its tokens up to the
        budget and the first EOS are appended, the hooks see them."""
        if self.trees is not None:
            self.trees.observe_round(r)
        elif self.decoder.drafter is not None and not r.forced:
            self.policy.observe_round(r.drafters_part())
        if self.on_round is not None:
            self.on_round(r)
        new = list(r.emitted[: self.remaining])
        hit = next((i for i, t in enumerate(new) if t in self.eos), None)
        if hit is not None:
            new = new[: hit + 1]
            self.stop = "eos"
        self.decoder.append(new, r.margins)
        if self.done:  # a drafter may read the whole output once (optional `end(seq)`)
            end = self.decoder.members.end
            if end is not None:
                end(self.decoder.seq)
        if self.on_tokens is not None:
            self.on_tokens(new)

    def result(self) -> GenerationResult:
        decoder, stop = self.decoder, self.stop
        if decoder.drafter is None:
            return decoder.result(stop, "none", 0, tree=False)
        if self.trees is not None:
            trees = self.trees
            return decoder.result(stop, trees.name, getattr(trees, "k", None), tree=True)
        fixed = self.policy.k if isinstance(self.policy, FixedK) else None
        return decoder.result(stop, self.policy.name, fixed, tree=False)


def constrained(
    grammar: Grammar | None, tokenizer: Any, vocab: int, eos: frozenset[int]
) -> Constraint | None:
    """A generation's grammar state (`structured.bind`), or None without a grammar."""
    if grammar is None:
        if tokenizer is not None:
            raise ValueError("tokenizer= is read only with a grammar; pass grammar= or drop it")
        return None
    if tokenizer is None:
        raise ValueError(
            "a grammar needs the target's tokenizer to know each token's text: pass "
            "tokenizer= (a transformers fast tokenizer)"
        )
    from specdec_rs.structured import bind

    return bind(grammar, tokenizer, vocab, eos)


def round_k(k: int, remaining: int) -> int:
    """Drafts this round: a round emits at most k+1 tokens, never past the budget."""
    return max(0, min(k, remaining - 1))


def source_router(policy: KPolicy, drafter: Any) -> Callable[[Any], None] | None:
    """For a policy with one γ per source (``use(source)``, e.g. `BySource`):
    a function that tells it, before each round, which source the drafter
    will draft from (``drafter.source(seq)``). None for other policies."""
    use = getattr(policy, "use", None)
    if not callable(use) or drafter is None:
        return None
    members = Members.of(drafter)
    source = members.source
    if source is None:
        raise ValueError(
            f"the policy {policy.name} chooses γ per source of drafts, but the drafter "
            f"{getattr(drafter, 'name', drafter)!r} has no source(seq); use it with a drafter "
            "that mixes sources (e.g. hybrid) or give a single policy"
        )
    for name in members.parts or ():
        use(name)  # every source the drafter may name has a policy (checked before any work)
    policy.reset()

    def route(seq: Any) -> None:
        use(source(seq))

    return route


def announce_catch_up(policy: Any, drafter: Any, decoder: Decoder, max_new: int) -> None:
    """Tell a policy that judges catch-ups (`MeasuredK.observe_start`) what
    the drafter must run before its first draft (`DraftModel.catch_up`),
    what one of its steps costs, and the target's prefill time."""
    starting = getattr(policy, "observe_start", None)
    catch_up = decoder.members.catch_up
    if not callable(starting) or catch_up is None:
        return
    behind = catch_up(decoder.seq)
    if behind > 0:
        step = drafter.step_seconds()
        starting(decoder.stats.prefill, decoder.prompt_length - 1, behind, step, max_new)
