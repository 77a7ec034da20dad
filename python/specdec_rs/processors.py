"""Sampling processors applied identically to target and draft. p = target, q = draft.

Speculative sampling reproduces whatever distribution the target rows p hold,
so "sample from the target at temperature T with top-k/top-p/min-p" means p
must be the *processed* distribution, and the drafter's q must be the exact
distribution its drafts were drawn from. One function, `logits_to_probs`, makes
both; using it for only one model (or processing q differently from how the
draft was drawn) biases the output.

The order and tie rules follow transformers' warpers (temperature, top-k,
top-p, min-p), so p equals what ``model.generate(do_sample=True, ...)`` samples.
temperature = 0 means greedy: a one-hot row at the first argmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.limits import MAX_TOP_K

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become probabilities.

    temperature: 0 (greedy) or > 0.  top_k: keep the k largest logits (ties
    at the k-th value kept) or None.  top_p: keep the smallest set of tokens
    whose mass reaches top_p, in (0, 1], or None.  min_p: keep tokens with
    probability >= min_p * max probability, in [0, 1], or None.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        # normalized to Python numbers (NumPy scalars accepted), frozen afterwards
        checked = {
            "temperature": _checks.real(
                self.temperature, "temperature", minimum=0.0, hint=" (0 means greedy)"
            ),
            "top_k": _checks.optional_integer(self.top_k, "top_k", minimum=1, maximum=MAX_TOP_K),
            "top_p": _checks.optional_real(
                self.top_p, "top_p", above=0.0, maximum=1.0, hint="; pass e.g. 0.9, or None"
            ),
            "min_p": _checks.optional_real(
                self.min_p, "min_p", minimum=0.0, maximum=1.0, hint="; pass e.g. 0.05, or None"
            ),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: Any, config: SamplingConfig, *, name: str = "logits") -> torch.Tensor:
    """Processed probabilities, float32, same shape as `logits` (..., V).

    greedy: one-hot at argmax. Otherwise softmax(filter((logits − max) / T))
    where the filters mask tokens to -inf exactly as transformers' warpers do
    (subtracting each row's max first changes nothing but keeps a tiny T from
    overflowing; as T → 0 the row tends to uniform over its argmax set).
    A row with a NaN, a +inf, or nothing above -inf is a ValueError.
    """
    return _process(logits, config, name, defer=False)[0]


def _process(
    logits: Any, config: SamplingConfig, name: str, *, defer: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs, bad): bad (...,) marks rows with a NaN, a +inf or no finite
    logit. Without `defer` such a row raises at once (a host sync); with it,
    the row comes back uniform, so that sampling from it is safe until the
    caller raises."""
    import torch

    if not isinstance(config, SamplingConfig):
        raise ValueError(f"config is a {type(config).__name__}; expected a SamplingConfig")
    logits = _checked_logits(logits, name)
    top = row_max(logits)  # NaN if a NaN is present
    bad = ~torch.isfinite(top)
    if not defer:
        _raise_bad_rows(bad[..., 0], name)
    else:
        logits = logits.masked_fill(bad, 0.0)
        top = top.masked_fill(bad, 0.0)
    if config.greedy:
        return one_hot(argmax(logits), logits.shape[-1]), bad[..., 0]
    shifted = logits - top
    scores = shifted / config.temperature if config.temperature != 1.0 else shifted
    if float(torch.tensor(config.temperature, dtype=torch.float32)) == 0.0:
        scores = scores.masked_fill(shifted == 0, 0.0)  # T below float32's range: 0/0
    neg_inf = float("-inf")
    if config.top_k is not None and config.top_k < scores.shape[-1]:
        scores = scores.masked_fill(scores < _kth_largest(scores, config.top_k), neg_inf)
    if config.top_p is not None and config.top_p < 1.0:
        scores = scores.masked_fill(_top_p_drop(scores, config.top_p), neg_inf)
    if config.min_p is not None and config.min_p > 0:
        probs = scores.softmax(dim=-1)
        drop = probs < config.min_p * probs.amax(dim=-1, keepdim=True)
        scores = scores.masked_fill(drop, neg_inf)
    out: torch.Tensor = scores.softmax(dim=-1)
    return out, bad[..., 0]


def _checked_logits(logits: Any, name: str) -> torch.Tensor:
    """`logits` as float32 after the shape and type checks: a floating-point
    torch tensor (..., V), V >= 1, with values (not on the meta device)."""
    import torch

    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name} is a {type(logits).__name__}; expected a torch tensor (..., V)")
    if logits.device.type == "meta":
        raise ValueError(f"{name} is a tensor on the meta device (it has no values)")
    if not (logits.is_floating_point() and logits.ndim >= 1 and logits.shape[-1] >= 1):
        raise ValueError(
            f"{name} has dtype {logits.dtype} and shape {tuple(logits.shape)}; "
            "expected floating-point logits of shape (..., V), V >= 1"
        )
    return logits.float()


def row_max(rows: torch.Tensor) -> torch.Tensor:
    """Each row's largest value (..., 1), NaN where the row has one:
    `rows.amax(-1, keepdim=True)`, the same number (a maximum is exact), by
    NumPy where it may read the rows in place (a 49,152-wide row: about
    10 µs against torch's 100 µs on one thread)."""
    import numpy as np
    import torch

    if not _on_numpy(rows):
        return rows.amax(dim=-1, keepdim=True)
    return torch.from_numpy(np.asarray(rows.numpy().max(-1, keepdims=True)))


def _on_numpy(rows: torch.Tensor) -> bool:
    """Whether NumPy may read `rows` in place (float32, CPU, outside autograd)."""
    import torch

    return rows.device.type == "cpu" and rows.dtype == torch.float32 and not rows.requires_grad


def _kth_largest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's k-th largest value, (..., 1): `torch.topk(...).values[..., -1:]`
    (the same number), by NumPy's partition on the CPU (a 49,152-wide row:
    ~0.1 against ~0.4 ms)."""
    import numpy as np
    import torch

    if not _on_numpy(scores):
        return torch.topk(scores, k, dim=-1).values[..., -1:]
    v = scores.shape[-1]
    rows = scores.contiguous().numpy().reshape(-1, v)
    kth = np.partition(rows, v - k, axis=-1)[:, v - k]
    return torch.from_numpy(np.ascontiguousarray(kth)).reshape(*scores.shape[:-1], 1)


TOP_P_CANDIDATES = 256  # the largest scores a row's top-p cut is first looked for among


def _top_p_drop(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens top-p removes, (..., V) bool, as transformers'
    `TopPLogitsWarper`: scores sorted ascending, softmax, cumulative sums
    (in float64, each cast to float32); the positions whose sum is <= 1 -
    top_p are dropped, never the largest. That sort (~4 ms for a
    49,152-wide row on one thread, as long as SmolLM2's whole step) is
    only needed near the cut: on the CPU the cut is looked for among the
    `TOP_P_CANDIDATES` largest scores (16 times as many while the cut lies
    below them, up to the whole row), below them only their mass. Where
    the cut falls between two equal scores the row takes the full sort, so
    tied tokens are kept or dropped in torch.sort's order, as transformers does; elsewhere
    the kept set is every score at or above the first kept one, the same
    set up to the rounding of the sums (float64 sums in another order)."""
    import numpy as np
    import torch

    if _on_numpy(scores):
        v = scores.shape[-1]
        flat = scores.contiguous().reshape(-1, v)
        probs = flat.softmax(dim=-1).numpy()
        limit = np.float32(1 - top_p)
        drop = torch.zeros(flat.shape, dtype=torch.bool)
        slow = []
        for r, row in enumerate(flat.numpy()):
            first = _top_p_first_kept(row, probs[r], limit)
            if first is None:
                slow.append(r)
            else:
                drop[r] = torch.from_numpy(row < first)
        if slow:
            drop[slow] = _top_p_drop_sorted(flat[slow], top_p)
        return drop.reshape(scores.shape)
    return _top_p_drop_sorted(scores, top_p)


def _top_p_first_kept(row: Any, probs: Any, limit: Any) -> float | None:
    """The smallest score top-p keeps in one row (see `_top_p_drop`), found
    among its largest scores; None where the full sort must decide."""
    import numpy as np

    finite = row > -np.inf
    if not finite.all():  # top-k's -inf scores: no mass, always dropped
        row, probs = row[finite], probs[finite]
    v, total = len(row), probs.sum(dtype=np.float64)
    k = min(TOP_P_CANDIDATES, v)
    while True:
        kth = np.partition(row, v - k)[v - k]
        picked = np.flatnonzero(row >= kth)  # every score tied with the k-th too
        # ascending; a softmax is monotone, so the masses sort as their scores
        values, mass = np.sort(row[picked]), np.sort(probs[picked]).astype(np.float64)
        below = total - mass.sum()  # the mass under the candidates
        if len(picked) < v and np.float32(below) > limit:
            k = min(16 * k, v)  # the cut lies below the candidates (never all of them)
            continue
        dropped = (below + np.cumsum(mass)).astype(np.float32) <= limit
        dropped[-1] = False
        first = int(np.argmin(dropped))  # the first kept position (dropped is a prefix)
        if first > 0 and values[first - 1] == values[first]:
            return None  # a tie across the cut: torch.sort's order decides
        return float(values[first])


def _top_p_drop_sorted(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """`_top_p_drop` by the full sort, as transformers' warper."""
    import torch

    sorted_scores, order = torch.sort(scores, dim=-1)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= 1 - top_p
    drop_sorted[..., -1:] = False
    out: torch.Tensor = drop_sorted.scatter(-1, order, drop_sorted)
    return out


def _raise_bad_rows(bad: torch.Tensor, name: str) -> None:
    """ValueError naming the first row marked in `bad` (a host sync)."""
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        where = f"{name} row {index[0] if len(index) == 1 else index}" if index else name
        raise ValueError(
            f"{where} has a NaN, a +inf or no finite value; expected finite logits "
            "(a model producing NaN often overflowed: try float32)"
        )


def argmax(rows: torch.Tensor) -> torch.Tensor:
    """The index of each row's first largest value: (..., V) -> (...,)
    int64, as `torch.argmax` (a NaN counts as the largest). A float32 CPU
    tensor outside autograd goes through NumPy's vectorized argmax (a
    49,152-wide row: 5 µs against torch's 88 µs, one thread)."""
    import numpy as np
    import torch

    if not _on_numpy(rows):
        return rows.argmax(dim=-1)
    return torch.from_numpy(np.asarray(rows.numpy().argmax(-1), dtype=np.int64))


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 rows (..., V) with a 1 at each token id."""
    import torch

    out = torch.zeros((*tokens.shape, vocab_size), dtype=torch.float32, device=tokens.device)
    return out.scatter_(-1, tokens.unsqueeze(-1), 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of `probs` (n, V), drawn exactly from that row."""
    import torch

    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class Sampler:
    """The one place that turns logits into rows and rows into tokens, for
    target and drafter alike: the first `vocab_size` logits are kept (padded
    LM heads), processed by `config`, and drawn with `generator` (whose
    device is where the rows live).

    On the CPU a bad logit row (NaN, +inf, all -inf) raises at once. On an
    accelerator that check would cost a host sync per token, so the row is
    made safe (uniform), its flag kept, and `take_flags` hands the flags to
    the round, which copies them to the host with its other values and
    raises before emitting anything.
    """

    def __init__(self, config: SamplingConfig, vocab_size: int, generator: torch.Generator):
        self.config = config
        self.vocab_size = vocab_size
        self.generator = generator
        self.device = generator.device
        self._flags: list[tuple[torch.Tensor, str]] = []

    @property
    def eager(self) -> bool:
        """Checks raise at once (CPU), instead of being deferred to the round."""
        return bool(self.device.type == "cpu")

    def probs(self, logits: torch.Tensor, name: str = "logits") -> torch.Tensor:
        """(n, V') logits -> (n, vocab_size) float32 processed probabilities."""
        probs, bad = _process(
            logits[..., : self.vocab_size], self.config, name, defer=not self.eager
        )
        if not self.eager:
            self._flags.append((bad.any(), name))
        return probs

    def greedy_tokens(self, logits: torch.Tensor, name: str = "logits") -> torch.Tensor:
        """(n, V') logits -> (n,) int64: each row's first argmax over the first
        `vocab_size` logits, which is all a greedy config's one-hot `probs`
        rows hold (`verify_greedy` reads only these). The same checks as
        `probs` on the CPU: a row with a NaN, a +inf or no finite logit raises."""
        if not self.config.greedy or not self.eager:
            raise ValueError(
                "greedy_tokens needs a greedy config (temperature 0) on the CPU; "
                "use probs() for sampled rows or rows on an accelerator"
            )
        import numpy as np
        import torch

        rows = _checked_logits(logits, name)[..., : self.vocab_size]
        tokens = argmax(rows)
        # one pass: an argmax lands on a row's first NaN or +inf, and on -inf
        # only where every value is -inf, so the values it picks judge the rows
        if _on_numpy(rows):
            flat = rows.numpy().reshape(-1, rows.shape[-1])
            picked = flat[np.arange(len(flat)), tokens.numpy().reshape(-1)]
            if np.isfinite(picked).all():
                return tokens
        _raise_bad_rows(~torch.isfinite(rows.gather(-1, tokens[..., None]))[..., 0], name)
        return tokens

    def take_flags(self) -> list[tuple[torch.Tensor, str]]:
        """The deferred checks since the last call: (0-d bool tensor, what)."""
        flags, self._flags = self._flags, []
        return flags

    def draw_distinct(self, probs: torch.Tensor, m: int) -> torch.Tensor:
        """Up to m distinct ids drawn from one row `probs` (V',) without
        replacement, in draw order (Gumbel top-k: the order of the keys
        log p + Gumbel is that of sequential draws, each from the row
        renormalized over the ids not drawn yet); fewer when the row has
        fewer than m positive entries."""
        import torch

        u = torch.rand(probs.shape, generator=self.generator, device=probs.device)
        keys = probs.log() - (-u.log()).log()
        m = min(m, int((probs > 0).sum()))
        return keys.topk(m).indices

    def draw(
        self, probs: torch.Tensor, *, greedy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (n,), q (n, V)): a sample of each row, and the row it was
        drawn from (one-hot at the argmax when `greedy`)."""
        if greedy or self.config.greedy:
            tokens = argmax(probs)
            return tokens, one_hot(tokens, probs.shape[-1])
        return sample(probs, self.generator), probs
