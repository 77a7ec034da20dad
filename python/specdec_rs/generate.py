"""Speculative generation with transformers causal LMs. p = target, q = draft, k = γ.

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

import inspect
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks, models
from specdec_rs._core import row_seed
from specdec_rs._files import json_safe
from specdec_rs.limits import MAX_NEW_TOKENS
from specdec_rs.policy import FixedK, KPolicy, as_policy, as_tree_policy
from specdec_rs.processors import Sampler, SamplingConfig
from specdec_rs.timing import Throughput
from specdec_rs.verify import CHILDREN, verify, verify_gathered, verify_tree

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from specdec_rs.drafters import Drafter


@dataclass(frozen=True)
class GenerationResult(Throughput):
    """New tokens and the statistics that explain the speed.

    k: the most drafts any round asked for; policy: how k was chosen.
    accepted_histogram[m]: rounds that kept m drafts (m = 0..k).
    reached[i], accepted[i]: rounds whose draft i (0-based) was checked / kept;
    position_alpha[i] = accepted[i] / reached[i] is P(accept i | reached i).
    alpha = sum(accepted) / sum(reached): the i.i.d. estimate of α.
    k_per_round, kept_per_round: drafts asked for and kept, round by round.
    Times in seconds; total includes the prefill.
    """

    tokens: list[int]
    prompt_length: int
    drafter: str
    k: int
    policy: str
    temperature: float
    seed: int
    stop_reason: str
    rounds: int
    drafted: int
    accepted_histogram: list[int]
    reached: list[int]
    accepted: list[int]
    time_prefill: float
    time_draft: float
    time_target: float
    time_verify: float
    time_total: float
    k_per_round: list[int] = field(repr=False)
    kept_per_round: list[int] = field(repr=False)

    @property
    def tokens_per_pass(self) -> float:
        """New tokens per target forward (the prefill not counted)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def alpha(self) -> float:
        """Accepted drafts / drafts checked (nan when nothing was drafted)."""
        checked = sum(self.reached)
        return sum(self.accepted) / checked if checked else float("nan")

    @property
    def position_alpha(self) -> list[float]:
        return [
            a / r if r else float("nan") for a, r in zip(self.accepted, self.reached, strict=True)
        ]

    def summary(self) -> dict[str, Any]:
        """The statistics as a flat JSON-ready dict."""
        summary: dict[str, Any] = json_safe(
            {
                "drafter": self.drafter,
                "k": self.k,
                "policy": self.policy,
                "temperature": self.temperature,
                "seed": self.seed,
                "new_tokens": self.new_tokens,
                "stop_reason": self.stop_reason,
                "rounds": self.rounds,
                "tokens_per_pass": self.tokens_per_pass,
                "alpha": self.alpha,
                "position_alpha": self.position_alpha,
                "accepted_histogram": self.accepted_histogram,
                "tokens_per_second": self.tokens_per_second,
                "time_prefill": self.time_prefill,
                "time_draft": self.time_draft,
                "time_target": self.time_target,
                "time_verify": self.time_verify,
                "time_total": self.time_total,
            }
        )
        return summary


def prompt_tensor(input_ids: Any, vocab_size: int) -> torch.Tensor:
    """(n,) int64 tokens from a list, (n,) or (1, n) tensor/array; batch 1 only."""
    import numpy as np
    import torch

    if isinstance(input_ids, str):
        raise ValueError(
            "input_ids is a str; generate() takes token ids: tokenize first, e.g. "
            "workloads.encode(tokenizer, text) or tokenizer(text)['input_ids']"
        )
    a = _checks.as_numpy(input_ids, "input_ids")
    if a.size == 0 and a.dtype.kind in "fO":
        a = a.astype(np.int64)  # an empty list: the shape check below names it
    if a.dtype.kind not in "iu":
        raise ValueError(f"input_ids has dtype {a.dtype}; expected integer token ids")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"input_ids holds {int(a.max())}, which is not a token id")
    ids = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise ValueError(
                f"input_ids has batch size {ids.shape[0]}; generate() decodes one sequence "
                "(batch size 1): call it once per prompt"
            )
        ids = ids[0]
    if ids.ndim != 1 or ids.numel() == 0:
        raise ValueError(
            f"input_ids has shape {tuple(ids.shape)}; expected a non-empty prompt (n,) or (1, n)"
        )
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(
            f"input_ids holds ids outside [0, {vocab_size}); tokenize with the model's tokenizer"
        )
    return ids.contiguous()


def shared_vocab(target: PreTrainedModel, drafter: Any, vocab_size: int | None) -> int:
    """Entries of p and q compared: vocab_size, else the target's LM head rows,
    which the drafter's must equal (padded heads need vocab_size=len(tokenizer))."""
    v_target = models.vocab_of(target)
    v_draft = getattr(drafter, "vocab_size", None)
    if vocab_size is not None:
        v = _checks.integer(vocab_size, "vocab_size", minimum=1)
        for who, rows in (("target", v_target), ("drafter", v_draft)):
            if rows is not None and rows < v:
                raise ValueError(f"vocab_size = {v} but the {who}'s LM head has only {rows} rows")
        return v
    if v_draft is not None and v_draft != v_target:
        raise ValueError(
            f"the target's LM head has {v_target} rows and the drafter's {v_draft}: models with "
            "different tokenizers cannot be paired; if they share one (padded heads), pass "
            "vocab_size=len(tokenizer)"
        )
    return v_target


def eos_set(eos_token_id: int | Iterable[int] | None, target: PreTrainedModel) -> frozenset[int]:
    """None -> the target's generation_config.eos_token_id; [] -> never stop early."""
    if eos_token_id is None:
        config = getattr(target, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None:
            return frozenset()
    return frozenset(_checks.integers(eos_token_id, "eos_token_id"))


def check_drafter(drafter: Any, target: PreTrainedModel) -> None:
    """ValueError unless `drafter` is None or a drafter that can serve `target`."""
    if drafter is None:
        return
    if isinstance(drafter, str):
        raise ValueError(
            f"drafter = {drafter!r} is a string; pass a drafter object, e.g. "
            "specdec_rs.PromptLookup() or specdec_rs.EarlyExit(target, 24), or None"
        )
    missing = [m for m in ("start", "propose", "update") if not callable(getattr(drafter, m, None))]
    if missing or not isinstance(getattr(drafter, "name", None), str):
        raise ValueError(
            f"drafter = {drafter!r} ({type(drafter).__name__}) is not a drafter: it needs a "
            f"`name` and the methods start, propose and update (missing: {missing or ['name']})"
        )
    for method, params in (
        ("start", "(seq, target_cache, target_hidden)"),
        ("update", "(seq, num_accepted, target_hidden)"),
    ):
        try:
            inspect.signature(getattr(drafter, method)).bind(None, None, None)
        except TypeError:
            raise ValueError(
                f"drafter {drafter.name}: {method}() must take {params}; see specdec_rs.drafters"
            ) from None
        except ValueError:
            pass  # no signature to inspect (a builtin): let the call decide
    check = getattr(drafter, "check_target", None)
    if callable(check):
        check(target)


def check_context(
    target: PreTrainedModel, prompt_length: int, max_new_tokens: int, allow: bool
) -> None:
    """ValueError when prompt + max_new_tokens passes the model's trained context
    (config.max_position_embeddings), unless `allow` (positions past it are
    extrapolated: the output may degrade)."""
    limit = getattr(target.config, "max_position_embeddings", None)
    if allow or not isinstance(limit, int) or prompt_length + max_new_tokens <= limit:
        return
    raise ValueError(
        f"the prompt ({prompt_length} tokens) plus max_new_tokens ({max_new_tokens}) is "
        f"{prompt_length + max_new_tokens} positions, past the model's context of {limit} "
        "(config.max_position_embeddings); shorten the prompt, lower max_new_tokens, or pass "
        "allow_past_context=True to run past it anyway"
    )


def round_k(k: int, remaining: int) -> int:
    """Drafts this round: a round emits at most k+1 tokens, never past the budget."""
    return max(0, min(k, remaining - 1))


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
    allow_past_context: bool = False,
    transfer: str = "auto",
    tree: Any = None,
) -> GenerationResult:
    """Sample up to `max_new_tokens` from the target, speculatively.

    The output has exactly the distribution of target-only sampling with the
    same processors (at temperature 0: the target's greedy output). Stops after
    the first EOS (kept) or at the budget. `on_tokens` gets each round's new ids.
    k: drafts per round, or a policy choosing them each round (see policy.py).
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
    if on_tokens is not None:
        _checks.function(on_tokens, "on_tokens")
    allow = _checks.boolean(allow_past_context, "allow_past_context")
    prompt = prompt_tensor(input_ids, shared_vocab(target, drafter, vocab_size))
    check_context(target, len(prompt), max_new, allow)
    budget = None if tree is None else check_tree_drafter(drafter, tree)
    route = source_router(policy, drafter)
    timed = getattr(policy, "observe_time", None)  # a policy that measures its costs
    timed = timed if callable(timed) else None
    if budget is not None and not isinstance(budget, int):
        budget.reset()
    with torch.inference_mode():
        decoder = Decoder(target, drafter, prompt, config, seed, vocab_size, transfer=transfer)
        if budget is None:
            announce_catch_up(policy, drafter, decoder, max_new)
        stop = "length"
        while decoder.generated < max_new:
            if budget is not None:
                size = budget if isinstance(budget, int) else budget.next_budget()
                new = decoder.step_tree(size)
                if not isinstance(budget, int):
                    budget.observe(size, decoder.last_depth, len(new))
                new = new[: max_new - decoder.generated]
            else:
                if route is not None:
                    route(decoder.seq)
                want = policy.next_k() if drafter is not None else 0
                new = decoder.step(round_k(want, max_new - decoder.generated))
            if drafter is not None and budget is None:
                policy.observe(*decoder.last_round)
                if timed is not None:
                    timed(*decoder.last_times)
            hit = next((i for i, t in enumerate(new) if t in eos), None)
            if hit is not None:
                new = new[: hit + 1]
                stop = "eos"
            decoder.append(new)
            if on_tokens is not None:
                on_tokens(new)
            if stop == "eos":
                break
    if drafter is None:
        return decoder.result(stop, "none", 0)
    if isinstance(budget, int):
        return decoder.result(stop, f"tree:{budget}", budget)
    if budget is not None:
        return decoder.result(stop, budget.name, getattr(budget, "k", None))
    return decoder.result(stop, policy.name, policy.k if isinstance(policy, FixedK) else None)


def source_router(policy: KPolicy, drafter: Any) -> Callable[[Any], None] | None:
    """For a policy with one γ per source (``use(source)``, e.g. `BySource`):
    a function that tells it, before each round, which source the drafter
    will draft from (``drafter.source(seq)``). None for other policies."""
    use = getattr(policy, "use", None)
    if not callable(use) or drafter is None:
        return None
    source = getattr(drafter, "source", None)
    if not callable(source):
        raise ValueError(
            f"the policy {policy.name} chooses γ per source of drafts, but the drafter "
            f"{getattr(drafter, 'name', drafter)!r} has no source(seq); use it with a drafter "
            "that mixes sources (e.g. hybrid) or give a single policy"
        )
    parts = getattr(drafter, "parts", None)
    for name in parts if isinstance(parts, dict) else ():
        use(name)  # every source the drafter may name has a policy (checked before any work)
    policy.reset()

    def route(seq: Any) -> None:
        use(source(seq))

    return route


def check_tree_drafter(drafter: Any, tree: Any) -> Any:
    """The tree budget (nodes per round) or tree policy, checked with the drafter."""
    budget = as_tree_policy(tree)
    if drafter is None or not callable(getattr(drafter, "propose_tree", None)):
        name = getattr(drafter, "name", None)
        raise ValueError(
            f"tree = {tree!r} needs a drafter that drafts trees (propose_tree): prompt-lookup, "
            f"eagle, medusa or hybrid; got {name or drafter!r}"
        )
    check = getattr(drafter, "check_tree", None)
    if callable(check):
        check()  # a drafter configured for chains only says so here, before any work
    return budget


def announce_catch_up(policy: Any, drafter: Any, decoder: Decoder, max_new: int) -> None:
    """Tell a policy that judges catch-ups (`MeasuredK.observe_start`) what
    the drafter must run before its first draft (`DraftModel.catch_up`),
    what one of its steps costs, and the target's prefill time."""
    starting = getattr(policy, "observe_start", None)
    catch_up = getattr(drafter, "catch_up", None)
    if not callable(starting) or not callable(catch_up):
        return
    behind = catch_up(decoder.seq)
    if behind > 0:
        step = drafter.step_seconds()
        starting(decoder.stats.prefill, decoder.prompt_length - 1, behind, step, max_new)


def checked_tree(draft: Any, budget: int, vocab: int, name: str) -> Any:
    """A drafter's TreeDraft, checked before the target runs: at most `budget`
    integer ids in [0, V) (not bools), integer parents in topological order,
    a known children kind, and a float q tensor of shape (n + 1, V) unless
    children="fixed". Returned as a TreeDraft of int64 tokens and int parents."""
    import torch

    from specdec_rs.models import tree_depths

    tokens, parents = getattr(draft, "tokens", None), getattr(draft, "parents", None)
    children, q = getattr(draft, "children", None), getattr(draft, "q", "missing")
    if not isinstance(tokens, torch.Tensor) or parents is None or isinstance(q, str):
        raise ValueError(
            f"drafter {name} returned {type(draft).__name__} from propose_tree; expected a "
            "TreeDraft(tokens, parents, q, children)"
        )
    parents = _checks.integers(parents, f"drafter {name}'s tree parents", minimum=-1)
    n = len(tokens)
    integer = not tokens.dtype.is_floating_point and tokens.dtype != torch.bool
    if tokens.ndim != 1 or not integer or n > budget or len(parents) != n:
        raise ValueError(
            f"drafter {name} proposed a tree of {n} tokens (shape {tuple(tokens.shape)}, dtype "
            f"{tokens.dtype}) with {len(parents)} parents; expected at most {budget} integer "
            "ids and one parent each"
        )
    tree_depths(parents)
    _checks.choice(children, f"drafter {name}'s children", CHILDREN)
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"drafter {name} proposed ids outside the vocabulary [0, {vocab})")
    if children == "fixed" and q is not None:
        raise ValueError(f'drafter {name}: children="fixed" trees carry q=None')
    if children != "fixed":
        if not isinstance(q, torch.Tensor) or not q.is_floating_point():
            dtype = f" of {q.dtype}" if hasattr(q, "dtype") else ""
            raise ValueError(
                f"drafter {name} returned q as a {type(q).__name__}{dtype}; expected "
                f"({n + 1}, {vocab}) as a float torch tensor: the rows each node's children "
                "were drawn from"
            )
        if q.shape != (n + 1, vocab):
            raise ValueError(
                f"drafter {name} returned q of shape {tuple(q.shape)}; expected "
                f"({n + 1}, {vocab}): the rows each node's children were drawn from"
            )
    from specdec_rs.drafters.base import TreeDraft

    return TreeDraft(tokens.long(), parents, q, str(children))


Flag = tuple["torch.Tensor", str]  # a 0-d bool tensor on the device, and what it means


def checked_draft(
    draft: Any, k: int, vocab: int, name: str, eager: bool
) -> tuple[torch.Tensor, torch.Tensor, list[Flag]]:
    """(tokens (k',) int64, q (k', V), flags) of a drafter's proposal, checked
    before the target runs: a Draft, k' <= k, integer ids in [0, V), float q
    rows of shape (k', V), each finite, >= 0 and summing to 1. ValueError
    naming the drafter otherwise.

    `eager` (CPU): the value checks raise at once. Otherwise they cost a host
    sync, so they come back as flags for the round's single copy; the tokens
    returned are then clamped into [0, V) so the target's embedding never
    sees an id it cannot index.
    """
    import torch

    tokens, q = getattr(draft, "tokens", None), getattr(draft, "q", None)
    if not isinstance(tokens, torch.Tensor) or not isinstance(q, torch.Tensor):
        raise ValueError(
            f"drafter {name} returned {type(draft).__name__}; expected a Draft(tokens, q) "
            "of torch tensors"
        )
    if tokens.ndim != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(
            f"drafter {name} proposed tokens of shape {tuple(tokens.shape)} and dtype "
            f"{tokens.dtype}; expected a 1-D tensor of integer ids"
        )
    if len(tokens) > k:
        raise ValueError(
            f"drafter {name} proposed {len(tokens)} tokens; this round asked for <= {k}"
        )
    if q.shape != (len(tokens), vocab) or not q.is_floating_point():
        raise ValueError(
            f"drafter {name} returned q of shape {tuple(q.shape)} and dtype {q.dtype}; expected "
            f"float rows of shape ({len(tokens)}, {vocab}): the distributions the drafts came from"
        )
    tokens = tokens.to(torch.long)
    if len(tokens) == 0:
        return tokens, q, []
    outside = (tokens < 0) | (tokens >= vocab)
    sums, low = q.sum(-1, dtype=torch.float64), q.amin(-1)
    tol = _checks.torch_sum_tolerance(q.dtype, vocab)
    bad_q = ~torch.isfinite(sums) | (low < 0) | ((sums - 1).abs() > tol)
    outside_text = f"drafter {name} proposed ids outside the vocabulary [0, {vocab})"
    bad_q_text = (
        f"drafter {name} returned q rows that are not probability rows (finite, >= 0, sum "
        f"1 ± {tol:.0e}): q must be the distributions the drafts were drawn from"
    )
    if not eager:
        return (
            tokens.clamp(0, vocab - 1),
            q,
            [(outside.any(), outside_text), (bad_q.any(), bad_q_text)],
        )
    if bool(outside.any()):
        raise ValueError(f"{outside_text}: {tokens.tolist()}")
    if bool(bad_q.any()):
        i = int(bad_q.nonzero()[0, 0])
        raise ValueError(
            f"{bad_q_text}; row {i} sums to {float(sums[i]):.6g}, "
            f"smallest entry {float(low[i]):.3g}"
        )
    return tokens, q, []


class Decoder:
    """The state of one speculative generation: the sequence (on the host),
    the target's cache (always all of seq but its last token), the drafter,
    the RNGs. Runs wherever the target's weights are.

    Draft tokens come from `sampler` (a torch.Generator on the target's
    device seeded with `seed`); round r's accept/residual draws come from the
    Rust stream row_seed(seed, r).

    How a round reaches the Rust verifier (`transfer`): on the CPU the rows
    are read in place (zero-copy); elsewhere ("gathered") p_i(x_i), q_i(x_i),
    the drafts and the deferred checks travel to the host in one copy, then
    only the row(s) the last token is drawn from. transfer="gathered" runs
    that path on the CPU too (tests).
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter: Drafter | None,
        input_ids: Any,
        config: SamplingConfig,
        seed: int,
        vocab_size: int | None = None,
        *,
        transfer: str = "auto",
    ):
        import torch

        self.t_start = time.perf_counter()
        self.target, self.drafter, self.config, self.seed = target, drafter, config, seed
        vocab = shared_vocab(target, drafter, vocab_size)
        self.vocab = vocab
        self.seq = prompt_tensor(input_ids, vocab)
        self.prompt_length = len(self.seq)
        self.device = models.device_of(target)
        transfer = _checks.choice(transfer, "transfer", ("auto", "gathered"))
        self.gathered = transfer == "gathered" or self.device.type != "cpu"
        generator = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        self.sampler = Sampler(config, vocab, generator)
        self.stats = _Stats()
        self.cache = models.new_cache(target)
        self.wants_hidden = bool(getattr(drafter, "needs_target_hidden", False))
        hidden = None
        if self.prompt_length > 1:
            _, hidden = models.forward_with_hidden(
                target, self.seq[:-1], self.cache, keep=1, hidden=self.wants_hidden
            )
        if drafter is not None:
            drafter.start(self.seq, self.cache, hidden)
        self.stats.prefill = time.perf_counter() - self.t_start

    @property
    def generated(self) -> int:
        return len(self.seq) - self.prompt_length

    def step(self, k: int) -> list[int]:
        """One draft-verify round with up to k drafts; returns the emitted
        tokens (1..k+1). Call append() with them (or a prefix, at EOS) next."""
        import torch

        seq, sampler = self.seq, self.sampler
        t0 = time.perf_counter()
        flags: list[Flag] = []
        if self.drafter is not None and k > 0:
            drafts, q_rows, flags = checked_draft(
                self.drafter.propose(seq, k, sampler),
                k,
                self.vocab,
                self.drafter.name,
                eager=not self.gathered,
            )
        else:
            drafts, q_rows = torch.zeros(0, dtype=torch.long, device=self.device), None
        t1 = time.perf_counter()
        logits, hidden = models.forward_with_hidden(
            self.target,
            torch.cat([seq[-1:].to(self.device), drafts.to(self.device)]),
            self.cache,
            keep=len(drafts) + 1,
            hidden=self.wants_hidden,
        )
        t2 = time.perf_counter()
        p = sampler.probs(logits, name="the target's logits")
        q = q_rows if q_rows is not None else p[:0]
        seed = row_seed(self.seed, self.stats.rounds)
        if self.gathered:
            flags += sampler.take_flags()
            emitted = verify_gathered(p, q, drafts, seed, flags)
        else:
            emitted = verify(p, q, drafts, seed)
        out = [int(t) for t in emitted]
        num_accepted = len(out) - 1
        models.crop(self.cache, len(seq) + num_accepted)
        if self.drafter is not None:
            kept = hidden[: num_accepted + 1] if hidden is not None else None
            self.drafter.update(seq, num_accepted, kept)
        t3 = time.perf_counter()
        self.stats.add(k, len(drafts), num_accepted, t1 - t0, t2 - t1, t3 - t2)
        self.last_round = (k, len(drafts), num_accepted)
        self.last_times = (t1 - t0, t2 - t1, len(drafts) + 1)
        return out

    def step_tree(self, budget: int) -> list[int]:
        """One round with a draft tree of at most `budget` nodes: one target
        forward over the last token and every node (tree attention mask),
        `verify_tree`, the cache compacted to the committed text plus the
        accepted path. Returns the emitted tokens (1..depth + 1)."""
        import torch

        assert self.drafter is not None
        seq, sampler, name = self.seq, self.sampler, self.drafter.name
        t0 = time.perf_counter()
        propose_tree = getattr(self.drafter, "propose_tree")  # noqa: B009 (optional member)
        draft = checked_tree(propose_tree(seq, budget, sampler), budget, self.vocab, name)
        parents = [int(x) for x in draft.parents]
        t1 = time.perf_counter()
        logits, hidden = models.forward_tree(
            self.target, seq[-1:], draft.tokens, parents, self.cache, hidden=self.wants_hidden
        )
        t2 = time.perf_counter()
        p = sampler.probs(logits, name="the target's logits")
        for flag, what in sampler.take_flags():
            if bool(flag):
                raise ValueError(what)
        q = None if draft.q is None else draft.q.cpu()
        emitted, nodes = verify_tree(
            p.cpu(),
            q,
            draft.tokens.cpu(),
            parents,
            row_seed(self.seed, self.stats.rounds),
            children=draft.children,
        )
        out = [int(t) for t in emitted]
        kept = [int(i) for i in nodes]
        n = len(seq)  # the cache held n - 1 entries; the forward added n + len(tree)
        models.keep_positions(self.cache, torch.tensor([*range(n), *(n + i for i in kept)]))
        rows = [0, *(i + 1 for i in kept)]
        self.drafter.update(seq, len(kept), hidden[rows] if hidden is not None else None)
        t3 = time.perf_counter()
        depth = draft.depth
        self.last_depth = depth
        self.stats.add(depth, depth, len(kept), t1 - t0, t2 - t1, t3 - t2)
        self.stats.drafted += len(parents) - depth
        self.last_round = (budget, len(parents), len(kept))
        return out

    def append(self, tokens: list[int]) -> None:
        import torch

        self.seq = torch.cat([self.seq, torch.tensor(tokens, dtype=torch.long)])

    def result(self, stop: str, policy: str, k: int | None = None) -> GenerationResult:
        """k: the k to report (default: the most any round used)."""
        s = self.stats
        return GenerationResult(
            tokens=[int(t) for t in self.seq[self.prompt_length :]],
            prompt_length=self.prompt_length,
            drafter=self.drafter.name if self.drafter is not None else "none",
            k=max(s.k_per_round, default=0) if k is None else k,
            policy=policy,
            temperature=self.config.temperature,
            seed=self.seed,
            stop_reason=stop,
            rounds=s.rounds,
            drafted=s.drafted,
            accepted_histogram=s.histogram,
            reached=s.reached,
            accepted=s.accepted,
            time_prefill=s.prefill,
            time_draft=s.draft,
            time_target=s.target,
            time_verify=s.verify,
            time_total=time.perf_counter() - self.t_start,
            k_per_round=s.k_per_round,
            kept_per_round=s.kept_per_round,
        )


class _Stats:
    """Running counters of one generation (lists grow with the largest k seen)."""

    def __init__(self) -> None:
        self.rounds = 0
        self.drafted = 0
        self.histogram = [0]
        self.reached: list[int] = []
        self.accepted: list[int] = []
        self.k_per_round: list[int] = []
        self.kept_per_round: list[int] = []
        self.prefill = self.draft = self.target = self.verify = 0.0

    def add(
        self,
        k: int,
        drafted: int,
        num_accepted: int,
        t_draft: float,
        t_target: float,
        t_verify: float,
    ) -> None:
        grow = k - len(self.reached)
        if grow > 0:
            self.histogram += [0] * grow
            self.reached += [0] * grow
            self.accepted += [0] * grow
        self.rounds += 1
        self.drafted += drafted
        self.k_per_round.append(k)
        self.kept_per_round.append(num_accepted)
        self.histogram[num_accepted] += 1
        checked = min(num_accepted + 1, drafted)  # drafts 0..m-1 kept, draft m (if any) rejected
        for i in range(checked):
            self.reached[i] += 1
            self.accepted[i] += i < num_accepted
        self.draft += t_draft
        self.target += t_target
        self.verify += t_verify
