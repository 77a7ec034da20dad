"""Vectorized NumPy references: the speed baselines of the benchmarks and
independent implementations for the tests. p = target, q = draft, k = γ.

`verify_batch_numpy` also reproduces the known bugs (same names as
`specdec_rs.VARIANTS`) for rows that do not depend on the drafts, so the
statistical tests can show they catch them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def sample_rows(weights: np.ndarray, rng: np.random.Generator) -> IntArray:
    """One index per row of `weights` (B, V), proportional to the row (inverse CDF)."""
    cdf = np.cumsum(weights, axis=-1, dtype=np.float64)
    t = rng.random(cdf.shape[0]) * cdf[:, -1]
    idx: IntArray = np.minimum((cdf <= t[:, None]).sum(axis=-1), weights.shape[-1] - 1)
    return idx.astype(np.int64)


def verify_numpy(
    p_rows: np.ndarray, q_rows: np.ndarray, drafts: IntArray, rng: np.random.Generator
) -> IntArray:
    """One exact round in vectorized NumPy (the baseline `verify` is measured against)."""
    k = len(drafts)
    idx = np.arange(k)
    rejected = rng.random(k) * q_rows[idx, drafts] >= p_rows[idx, drafts]
    if not rejected.any():
        cdf = np.cumsum(p_rows[k], dtype=np.float64)
        bonus = np.searchsorted(cdf, rng.random() * cdf[-1], side="right")
        return np.append(drafts, bonus).astype(np.int64)
    i = int(np.argmax(rejected))
    cdf = np.cumsum(np.maximum(p_rows[i] - q_rows[i], 0), dtype=np.float64)
    j = np.searchsorted(cdf, rng.random() * cdf[-1], side="right")
    return np.append(drafts[:i], j).astype(np.int64)


def verify_block_numpy(
    p_rows: np.ndarray, q_rows: np.ndarray, drafts: IntArray, rng: np.random.Generator
) -> IntArray:
    """One block-verified round (Sun et al., 2025), written from the paper's
    algorithm: r_i = min(1, r_{i-1} p_{i-1}(x_i)/q_{i-1}(x_i)),
    h_i = Z_i / (Z_i + 1 − r_i) with Z_i = Σ max(0, r_i p_i − q_i) (h_k = r_k),
    τ = the last i with η_i < h_i; then norm(max(0, r_τ p_τ − q_τ)) or p_k."""
    k = len(drafts)
    ratio = np.ones(k + 1)
    for i in range(k):
        ratio[i + 1] = min(1.0, ratio[i] * p_rows[i, drafts[i]] / q_rows[i, drafts[i]])
    eta = rng.random(k)
    tau = 0
    for i in range(1, k + 1):
        if i == k:
            h = ratio[k]
        else:
            z = np.maximum(ratio[i] * p_rows[i] - q_rows[i], 0).sum()
            h = z / (z + 1 - ratio[i]) if z + 1 - ratio[i] > 0 else 1.0
        if eta[i - 1] < h:
            tau = i
    if tau == k:
        weights = p_rows[k]
    else:
        weights = np.maximum(ratio[tau] * p_rows[tau] - q_rows[tau], 0)
        if weights.sum() <= 0:
            weights = p_rows[tau]
    cdf = np.cumsum(weights, dtype=np.float64)
    last = np.searchsorted(cdf, rng.random() * cdf[-1], side="right")
    return np.append(drafts[:tau], last).astype(np.int64)


def verify_batch_numpy(
    p: np.ndarray,
    q: np.ndarray,
    drafts: IntArray,
    rng: np.random.Generator,
    variant: str = "exact",
) -> tuple[IntArray, IntArray]:
    """B rounds at once; same outputs as `specdec_rs.verify_batch` in distribution.

    p (B, k+1, V), q (B, k, V), drafts (B, k) -> tokens (B, k+1) padded with -1,
    num_emitted (B,).
    """
    b, kp1, _ = p.shape
    k = kp1 - 1
    rows = np.arange(b)
    tokens = np.full((b, kp1), -1, dtype=np.int64)
    alive = np.ones(b, dtype=bool)
    for i in range(k):
        x = drafts[:, i]
        px, qx = p[rows, i, x], q[rows, i, x]
        u = rng.random(b)
        if variant == "inverted_ratio":
            accept = u * px < qx
        elif variant == "greedy_check":
            accept = x == p[:, i].argmax(-1)
        elif variant == "no_verification":
            accept = np.ones(b, dtype=bool)
        elif variant == "off_by_one":
            accept = u * qx < p[rows, i + 1, x]
        else:
            accept = u * qx < px
        take = alive & accept
        tokens[take, i] = x[take]
        rej = alive & ~accept
        if rej.any():
            pr, qr = p[rej, i], q[rej, i]
            if variant == "resample_from_p":
                y = sample_rows(pr, rng)
            elif variant == "greedy_check":
                y = pr.argmax(-1)
            else:
                target = p[rej, i + 1] if variant == "off_by_one" else pr
                w = np.maximum(target - qr, 0)
                empty = w.sum(-1) <= 0
                w[empty] = target[empty]
                y = sample_rows(w, rng)
            tokens[rej, i] = y
        if variant != "continue_after_reject":
            alive = take
    if variant != "no_bonus" and alive.any():
        last = p[alive, k]
        tokens[alive, k] = last.argmax(-1) if variant == "greedy_check" else sample_rows(last, rng)
    return tokens, (tokens >= 0).sum(-1).astype(np.int64)


def simulate_round_lengths_numpy(
    p_table: np.ndarray,
    q_table: np.ndarray,
    *,
    k: int,
    rounds: int,
    start: int,
    rng: np.random.Generator,
    chains: int = 4096,
) -> IntArray:
    """`specdec_rs.simulate_round_lengths` (exact rule) vectorized over `chains`
    continuing generations from `start`. Returns counts by tokens emitted (k+2,)."""
    s, v = p_table.shape
    cdf_p = np.cumsum(p_table, -1)
    cdf_q = np.cumsum(q_table, -1)
    res = np.maximum(p_table - q_table, 0)
    res = np.where(res.sum(-1, keepdims=True) > 0, res, p_table)
    cdf_r = np.cumsum(res / res.sum(-1, keepdims=True), -1)

    def state(tokens: np.ndarray) -> np.ndarray:
        return tokens if s == v else np.zeros_like(tokens)

    def draw(cdf: np.ndarray, states: np.ndarray) -> np.ndarray:
        u = rng.random(len(states))
        tokens: np.ndarray = np.minimum((cdf[states] <= u[:, None]).sum(-1), v - 1)
        return tokens

    counts = np.zeros(k + 2, dtype=np.int64)
    last = np.full(chains, start, dtype=np.int64)
    done = 0
    while done < rounds:
        c = min(chains, rounds - done)
        ctx = last[:c].copy()
        drafts = np.empty((c, k), dtype=np.int64)
        cur = ctx
        for i in range(k):
            cur = draw(cdf_q, state(cur))
            drafts[:, i] = cur
        length = np.zeros(c, dtype=np.int64)
        alive = np.ones(c, dtype=bool)
        out_last = ctx.copy()
        for i in range(k):
            st, x = state(ctx), drafts[:, i]
            accept = alive & (rng.random(c) * q_table[st, x] < p_table[st, x])
            rej = alive & ~accept
            y = draw(cdf_r, st)
            out_last = np.where(accept, x, np.where(rej, y, out_last))
            length += alive
            alive = accept
            ctx = np.where(accept, x, ctx)
        bonus = draw(cdf_p, state(ctx))
        out_last = np.where(alive, bonus, out_last)
        length += alive
        counts += np.bincount(length, minlength=k + 2)
        last[:c] = out_last
        done += c
    return counts


TREE_BUGS = ("no_update", "original_p", "bonus_at_rejected", "as_iid")


def verify_tree_numpy(
    p_rows: np.ndarray,
    q_rows: np.ndarray,
    tokens: IntArray,
    parents: IntArray,
    rng: np.random.Generator,
    *,
    children: str = "iid",
    variant: str = "exact",
) -> IntArray:
    """One tree round in plain NumPy (an independent implementation of
    `specdec_rs.verify_tree`, materializing p' at each rejection), exact or
    with one of the known tree bugs (`TREE_BUGS`, as in `TREE_VARIANTS`)."""
    n = len(tokens)
    kids = [[i for i in range(n) if parents[i] + 1 == r] for r in range(n + 1)]
    kind = "iid" if variant == "as_iid" else children
    out: list[int] = []
    r = 0

    def draw(w: np.ndarray) -> int:
        cdf = np.cumsum(w, dtype=np.float64)
        return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))

    while True:
        if not kids[r]:
            return np.array([*out, draw(p_rows[r])], dtype=np.int64)
        if kind == "fixed":
            y = draw(p_rows[r])
            out.append(y)
            match = [c for c in kids[r] if tokens[c] == y]
            if not match:
                return np.array(out, dtype=np.int64)
            r = match[0] + 1
            continue
        cur, q, drawn = p_rows[r].astype(np.float64), q_rows[r].astype(np.float64), 0.0
        nxt = None
        for j, c in enumerate(kids[r]):
            x = int(tokens[c])
            qj = q / (1.0 - drawn) if kind == "without_replacement" else q
            target = p_rows[r][x] if variant in ("no_update", "original_p") else cur[x]
            if rng.random() * qj[x] < target:
                nxt = c
                break
            drawn += q[x]
            if variant != "no_update":
                res = np.maximum(cur - qj, 0.0)
                cur = res / res.sum() if res.sum() > 0 else cur
            if j + 1 == len(kids[r]):
                if variant == "bonus_at_rejected":
                    y = draw(p_rows[c + 1])
                elif variant == "no_update":
                    y = draw(np.maximum(p_rows[r] - qj, 0.0))
                else:
                    y = draw(cur)
                return np.array([*out, y], dtype=np.int64)
        assert nxt is not None
        out.append(int(tokens[nxt]))
        r = nxt + 1
