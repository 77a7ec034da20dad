"""A drafter's proposal, as the loop hands it to the verifier: a chain
(`Draft`) or a tree (`TreeDraft`), optionally with a `Window` of nodes the
target also runs but nobody verifies, and the checks every proposal passes
before the target runs. p = target, q = draft, k = γ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec_rs import _checks
from specdec_rs.trees import tree_depths
from specdec_rs.verify import CHILDREN

if TYPE_CHECKING:
    import torch

Flag = tuple["torch.Tensor", str]  # a 0-d bool tensor on the device, and what it means


@dataclass(frozen=True)
class Window:
    """Nodes the target runs in a round's forward beside the drafts, never
    verified and never kept in its cache: lookahead's Jacobi window. tokens
    (E,) int64; parents (E,): -1 hangs a node under the root (the last
    committed token), j >= 0 under window node j < its own index. Each node
    sees the cache, the root and its window ancestors (a tree mask) at
    position root + depth; the drafter reads the logits at the nodes `read`
    (ascending; None: every node), and the LM head runs on no other window
    node (``observe_window``)."""

    tokens: torch.Tensor
    parents: list[int]
    read: list[int] | None = None


@dataclass(frozen=True)
class Draft:
    """tokens: (k',) int64 proposals, k' <= k.  q: (k', V) float rows, row i the
    distribution tokens[i] was drawn from. Both on the sampler's device.
    source: the part that drafted, for a drafter made of parts (the hybrid).
    window: nodes run in the same forward and not verified (`Window`)."""

    tokens: torch.Tensor
    q: torch.Tensor
    source: str | None = None
    window: Window | None = None

    @property
    def parents(self) -> None:
        """A chain's drafts have no parents (a `TreeDraft`'s do)."""
        return None


@dataclass(frozen=True)
class TreeDraft:
    """A draft tree, as `specdec_rs.verify_tree` reads it: tokens (n,) int64
    and parents (n,) (-1 = the root, else an earlier node); q (n + 1, V) the
    rows the children of the root and of each node were drawn from, or None
    with children="fixed" (deterministic candidates: exact at any
    temperature, q not needed). source, window: as for `Draft`."""

    tokens: torch.Tensor
    parents: list[int]
    q: torch.Tensor | None
    children: str = "fixed"
    source: str | None = None
    window: Window | None = None

    @property
    def depth(self) -> int:
        return max(tree_depths(self.parents), default=0)


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
    tol = _checks.torch_sum_tolerance(q.dtype, vocab)
    sums, low = row_sums(q, tol, eager), q.amin(-1)
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


def row_sums(q: torch.Tensor, tol: float, eager: bool) -> torch.Tensor:
    """q's row sums in float64 (k',), as the check compares them with 1 ± tol.
    On the CPU (`eager`) a float32 or narrower q is summed in float32 first
    (a tenth of the time over 49,152 columns) and only the rows whose sum
    lies beyond 1 ± tol / 2, or is not finite, are summed again in float64:
    the float32 sum's error (cascaded, about 1e-6 here) is far below tol / 2,
    so every row is judged as its float64 sum would judge it."""
    import torch

    if not eager or q.dtype == torch.float64:
        return q.sum(-1, dtype=torch.float64)
    sums = q.sum(-1, dtype=torch.float32).double()
    near = ~torch.isfinite(sums) | ((sums - 1).abs() > tol / 2)
    if bool(near.any()):
        sums[near] = q[near].sum(-1, dtype=torch.float64)
    return sums


def checked_tree(draft: Any, budget: int, vocab: int, name: str) -> Any:
    """A drafter's TreeDraft, checked before the target runs: at most `budget`
    integer ids in [0, V) (not bools), integer parents in topological order,
    a known children kind, and a float q tensor of shape (n + 1, V) unless
    children="fixed". Returned as a TreeDraft of int64 tokens and int parents."""
    import torch

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
    window = checked_window(getattr(draft, "window", None), vocab, name)
    return TreeDraft(
        tokens.long(), parents, q, str(children), getattr(draft, "source", None), window
    )


def joined(
    tokens: torch.Tensor, parents: list[int], window: Window
) -> tuple[torch.Tensor, list[int], list[int] | None]:
    """The drafts (tokens (n,), parents, -1 = the root) and a window as one
    tree for `runner.forward_tree`: the window's nodes after the drafts (a
    parent -1 stays the root, j becomes n + j), and the logits rows to
    compute: the root's, every draft's and the window nodes read (None:
    every row)."""
    import torch

    n = len(tokens)
    all_parents = [*parents, *(par if par < 0 else n + par for par in window.parents)]
    all_tokens = torch.cat([tokens, window.tokens.to(tokens.device)])
    rows = None if window.read is None else [*range(n + 1), *(n + 1 + i for i in window.read)]
    return all_tokens, all_parents, rows


MAX_WINDOW = 4096  # the most window nodes one round may run


def checked_window(window: Any, vocab: int, name: str) -> Window | None:
    """A proposal's `Window` (or None), checked before the target runs: a
    1-D integer tensor of at most `MAX_WINDOW` ids in [0, V) and one parent
    each, -1 or an earlier window node. ValueError naming the drafter."""
    import torch

    if window is None:
        return None
    tokens, parents = getattr(window, "tokens", None), getattr(window, "parents", None)
    if not isinstance(tokens, torch.Tensor) or parents is None:
        raise ValueError(
            f"drafter {name} returned a window of type {type(window).__name__}; expected "
            "Window(tokens, parents) with a torch tensor of ids"
        )
    parents = _checks.integers(parents, f"drafter {name}'s window parents", minimum=-1)
    integer = not tokens.dtype.is_floating_point and tokens.dtype != torch.bool
    n = len(tokens)
    if tokens.ndim != 1 or not integer or len(parents) != n or n > MAX_WINDOW:
        raise ValueError(
            f"drafter {name} returned a window of {n} tokens (shape {tuple(tokens.shape)}, "
            f"dtype {tokens.dtype}) with {len(parents)} parents; expected at most {MAX_WINDOW} "
            "integer ids and one parent each"
        )
    tree_depths(parents)
    if n and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(
            f"drafter {name} put ids outside the vocabulary [0, {vocab}) in its window"
        )
    read = getattr(window, "read", None)
    if read is not None:
        read = _checks.integers(read, f"drafter {name}'s window read", minimum=0)
        if any(b <= a for a, b in zip(read, read[1:], strict=False)) or (read and read[-1] >= n):
            raise ValueError(
                f"drafter {name} reads window nodes {read}; expected ascending indices below {n}"
            )
    return Window(tokens.long(), parents, read)
