"""T(B, n, L), the target forward over B rows × n positions after L cached
positions each, measured on a runner's forward (a `BatchEngine`'s
`forward_blocks`) at two contexts L and cached on disk per model, host and
thread count: the `ForwardProfile` the `Goodput` policy reads.

Each row is a copy of one prefilled context of L positions; a sample is one
forward of B blocks of n tokens, after which every row's cache is cut back.
The median of `repeats` samples, after one warm-up, per grid point.
The grid's batch sizes stop at `profile_rows` (64 rows, and what the
runner's cache and 1 GiB of logits hold at the longer context); the policy
extrapolates T beyond by the last measured slope, so the profile's memory
and time follow the work, not `max_batch`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import platform
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from specdec_rs import _files, models
from specdec_rs.policy.goodput import ForwardProfile
from specdec_rs.runner import crop, forward, new_cache
from specdec_rs.timing import median_seconds

VERSION = 3  # 3: the kernels' 16-row panels and the activations in the key
MAX_PROFILE_ROWS = 64  # beyond, T(B, n) is extrapolated by the last measured slope
LOGITS_BYTES = 1 << 30  # the most the profile's logits (B · n · V float32) may take


class Runner(Protocol):
    """What the profile measures: a target's batched forward
    (`BatchEngine` is one) and the bounds it runs within."""

    target: Any
    vocab: int
    max_batch: int

    @property
    def path(self) -> str: ...

    @property
    def cache_positions(self) -> int: ...

    def forward_blocks(
        self, blocks: Sequence[Any], caches: Sequence[Any], *, hidden: bool, read: int | None = ...
    ) -> tuple[list[Any], list[Any] | None]: ...


def batch_grid(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to max_batch, and max_batch itself."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def profile_forward(
    runner: Runner,
    ks: Iterable[int],
    *,
    batch_sizes: Iterable[int] | None = None,
    context: int = 128,
    long_context: int = 512,
    repeats: int = 3,
    cached: bool = True,
) -> ForwardProfile:
    """T(B, n, L) on the grid batch_sizes × ks (positions n) at contexts L =
    `context` and `long_context` (0: only the first), see the module docs;
    read from / written to the cache folder when `cached`."""
    if long_context and long_context <= context:
        raise ValueError(
            f"long_context = {long_context} must exceed context = {context} (or be 0: none)"
        )
    ns = sorted(set(ks))
    cap = profile_rows(runner, max(ns), max(context, long_context))
    wanted = batch_grid(runner.max_batch) if batch_sizes is None else list(batch_sizes)
    bs = sorted({min(b, cap) for b in wanted})
    path = _cache_path(runner, bs, ns, (context, long_context)) if cached else None
    if path is not None and path.is_file():
        try:
            return ForwardProfile.from_json(
                _files.read_json(path, what="forward profile", fix="delete it to measure anew")
            )
        except ValueError:
            pass  # a damaged table is measured again (and replaced)
    grids = [_grid(runner, bs, ns, context, repeats)]
    if long_context:
        grids.append(_grid(runner, bs, ns, long_context, repeats))
    profile = ForwardProfile(
        grids[0], context, grids[1] if long_context else {}, long_context if long_context else 0
    )
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _files.write_json(path, profile.to_json(), what="forward profile")
        except (OSError, ValueError):
            pass  # no cache: measured again next time
    return profile


def profile_rows(runner: Runner, n: int, context: int) -> int:
    """The most rows one profile forward may take: at most
    `MAX_PROFILE_ROWS`, rows × (context + n) cache positions within the
    runner's `cache_positions`, and their logits (rows · n · V float32)
    within `LOGITS_BYTES`; a ValueError naming the bound when not one row fits."""
    by_cache = runner.cache_positions // (context + n)
    by_logits = LOGITS_BYTES // (4 * n * max(1, runner.vocab))
    rows = min(MAX_PROFILE_ROWS, runner.max_batch, by_cache, by_logits)
    if rows < 1:
        raise ValueError(
            f"the forward profile needs {context + n} cache positions (a context of {context} "
            f"and {n} positions) and {4 * n * runner.vocab:,} bytes of logits a row; the runner "
            f"holds {runner.cache_positions} positions (cache_positions) and the profile "
            f"{LOGITS_BYTES:,} bytes: raise cache_positions, or fix k (no goodput profile)"
        )
    return rows


def _grid(
    runner: Runner, bs: list[int], ns: list[int], context: int, repeats: int
) -> dict[tuple[int, int], float]:
    """T(B, n) at one context: median seconds of `repeats` forwards after a
    warm-up (`timing.median_seconds`)."""
    import torch

    target, vocab = runner.target, runner.vocab
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        base = new_cache(target)
        forward(target, torch.randint(0, vocab, (context,), generator=g), base, keep=1)
        caches = [copy.deepcopy(base) for _ in range(max(bs))]
        table: dict[tuple[int, int], float] = {}
        for b in bs:
            for n in ns:
                blocks = [torch.randint(0, vocab, (n,), generator=g) for _ in range(b)]

                def sample(blocks: list[Any] = blocks, b: int = b) -> None:
                    runner.forward_blocks(blocks, caches[:b], hidden=False)
                    for c in caches[:b]:  # cut back (timed too: microseconds)
                        crop(c, context)

                table[(b, n)] = median_seconds(sample, repeats, warmup=1)
    return table


def _cache_path(
    runner: Runner, bs: list[int], ns: list[int], context: tuple[int, int]
) -> Path | None:
    """cache_dir()/forward-profiles/<key>.json: the key names the model
    (`identity.fingerprint`), the host's CPU, torch's and the kernels'
    threads, the runner's forward path and the grid."""
    import torch

    from specdec_rs.gguf.model import activations_of, cache_type_of

    try:
        from specdec_rs.heads.identity import fingerprint

        model = fingerprint(runner.target)
    except (ValueError, RuntimeError, AttributeError):
        return None
    kernel_threads = next(
        (m.threads for m in runner.target.modules() if hasattr(m, "threads")), None
    )
    key = json.dumps(
        {
            "v": VERSION,
            "model": model,
            "cpu": _cpu_name(),
            "torch_threads": torch.get_num_threads(),
            "kernel_threads": kernel_threads,
            "activations": activations_of(runner.target),
            "cache_type": cache_type_of(runner.target),
            "path": runner.path,
            "bs": bs,
            "ns": ns,
            "context": context,
            "device": str(models.device_of(runner.target)),
            "cores": os.cpu_count(),
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return _files.cache_dir() / "forward-profiles" / f"{digest}.json"


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
