"""Draft trees as lists: depths, the tree attention mask, and the builders
that turn candidates into (tokens, parents) (-1 = the root, else an earlier
node, so nodes come in topological order). p = target, q = draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node of a tree given by `parents` (-1 = the root); the
    root's children have depth 1."""
    depth: list[int] = []
    for i, par in enumerate(parents):
        if not -1 <= par < i:
            raise ValueError(
                f"parents[{i}] = {par} is not an earlier node; expected -1 (the root) or an "
                f"index below {i}"
            )
        depth.append(1 if par < 0 else depth[par] + 1)
    return depth


def tree_mask(parents: Sequence[int], past: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """The additive attention mask (1, 1, n + 1, past + n + 1) of a tree
    forward: query 0 is the last committed token, query i + 1 node i; each
    attends to the `past` cached positions, the last token, and the nodes on
    its own path (its ancestors and itself); -inf (dtype min) elsewhere."""
    import torch

    n = len(parents)
    allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    allowed[:, 0] = True
    for i, par in enumerate(parents):
        if par >= 0:
            allowed[i + 1] = allowed[par + 1]
        allowed[i + 1, i + 1] = True
    allowed[0, 0] = True
    full = torch.ones(n + 1, past + n + 1, dtype=torch.bool)
    full[:, past:] = allowed
    mask = torch.zeros(full.shape, dtype=dtype)
    mask[~full] = torch.finfo(dtype).min
    return mask[None, None].to(device)


def chain_with_alternatives(
    chain: list[int], alternatives: list[list[int]]
) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the tree "top-w at each position": the chain
    c_0 c_1 ... (each under the previous) and, beside each c_d, its
    alternatives for that position as leaves under the same parent.

    >>> chain_with_alternatives([5, 6], [[7], [8]])
    ([5, 7, 6, 8], [-1, -1, 0, 0])
    """
    tokens: list[int] = []
    parents: list[int] = []
    parent = -1
    for d, c in enumerate(chain):
        here = len(tokens)
        tokens.append(c)
        parents.append(parent)
        for alt in alternatives[d] if d < len(alternatives) else []:
            if alt != c:
                tokens.append(alt)
                parents.append(parent)
        parent = here
    return tokens, parents


def confident_tree(
    ranked: list[tuple[list[int], list[float]]], budget: int
) -> tuple[list[int], list[int]]:
    """EAGLE-2's reranking on a drafted chain: `ranked[d]` holds the draft's
    top tokens at depth d (best first, the first one the chain's token) and
    their draft probabilities. A candidate's confidence is the product of
    the chain's probabilities above it and its own; the `budget` most
    confident candidates form the tree (chain tokens continue the chain, the
    others are leaves beside it). A child is never more confident than its
    parent, so the kept set is a tree.

    >>> confident_tree([([5, 7], [0.6, 0.3]), ([6, 8], [0.9, 0.05])], 3)
    ([5, 7, 6], [-1, -1, 0])
    >>> confident_tree([([5, 7], [0.9, 0.1]), ([6, 8], [0.5, 0.4]), ([1, 2], [0.9, 0.1])], 5)
    ([5, 7, 6, 8, 1], [-1, -1, 0, 0, 2])
    """
    scored: list[tuple[float, int, int]] = []  # (-confidence, depth, rank)
    above = 1.0
    for d, (_, probs) in enumerate(ranked):
        scored += [(-above * p, d, r) for r, p in enumerate(probs)]
        above *= probs[0] if probs else 0.0
    keep = sorted(sorted(scored)[:budget], key=lambda s: (s[1], s[2]))
    tokens: list[int] = []
    parents: list[int] = []
    chain = {-1: -1}  # depth -> the chain's node there (-1: the root)
    for _, d, r in keep:
        if d - 1 not in chain:
            break  # the chain above was not kept (ties): stop here
        tokens.append(ranked[d][0][r])
        parents.append(chain[d - 1])
        if r == 0:
            chain[d] = len(tokens) - 1
    return tokens, parents


def trie(continuations: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the prefix tree of `continuations` (in order of
    preference), at most `budget` nodes; shared prefixes share nodes.

    >>> trie([[1, 2, 3], [1, 4], [5]], 10)
    ([1, 2, 3, 4, 5], [-1, 0, 1, 0, -1])
    """
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for cont in continuations:
        node = -1
        for t in cont:
            nxt = child.get((node, t))
            if nxt is None:
                if len(tokens) >= budget:
                    break
                nxt = len(tokens)
                tokens.append(t)
                parents.append(node)
                child[(node, t)] = nxt
            node = nxt
    return tokens, parents
