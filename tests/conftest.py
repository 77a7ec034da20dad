"""Shared fixtures and settings; the constants and statistics come from the
package (`specdec_rs.toy`, `specdec_rs.stats`), defined once.

p = target, q = draft, k = γ.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from specdec_rs.stats import chi2_pvalue, softmax, tv
from specdec_rs.toy import CHAIN_P, CHAIN_Q, EXACT_PAIRS, IID_P, IID_Q, TV_RUNS, TV_THRESHOLD

# The names the tests use for the handout's models.
P_TABLE, Q_TABLE = CHAIN_P, CHAIN_Q
P_IID, Q_IID = IID_P[0], IID_Q[0]

__all__ = [
    "EXACT_PAIRS",
    "P_IID",
    "P_TABLE",
    "Q_IID",
    "Q_TABLE",
    "TV_RUNS",
    "TV_THRESHOLD",
    "chi2_pvalue",
    "softmax",
    "tv",
]

# CI runs these on two cores; keep hypothesis deterministic and patient.
settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", derandomize=False, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile("deep" if os.environ.get("SPECDEC_FUZZ_EXAMPLES") else "ci")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


# The modules that take longest, longest first: under pytest-xdist
# (--dist worksteal) each worker starts on a long module and the short ones
# fill the end, where an idle worker steals them.
LONGEST_FIRST = (
    "test_cli_models.py",
    "test_serve.py",
    "test_serve_limits.py",
    "test_smollm2.py",
    "test_generate.py",
    "test_lab.py",
    "test_cli.py",
    "test_power.py",
    "test_heads.py",
    "test_batch.py",
    "test_gguf.py",
    "test_gguf_architectures.py",
    "test_serve_fuzz.py",
    "test_fuzz.py",
    "test_testing.py",
    "test_verify.py",
    "test_serve_structured.py",
    "test_memory.py",
    "test_fuzz_files.py",
    "test_tree.py",
    "test_measure.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept within


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every module the tests import is imported now: freeze what exists
    (torch's, transformers' and the test modules' objects) so that Python's
    cyclic collector stops walking it at each full collection: a worker's
    time in the collector 4.1-4.8 s -> 2.9 s over the suite. Nothing is
    kept that a collection would have freed, save cycles made while importing."""
    gc.freeze()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (the default, pyproject.toml): one worker per core, at most 4:
    each worker imports torch and loads its own models."""
    return max(1, min(os.cpu_count() or 1, 4))


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker gets one torch thread, one GGUF kernel
    thread and one thread in rayon's global pool (the engine's and
    `verify_batch`'s default): two workers with two threads each on two
    cores stall each other (and a GGUF load's thread probe, ~0.1 s a load,
    would measure the other worker). The tests of other thread counts name
    theirs."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("SPECDEC_KERNEL_THREADS", "1")
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(1)
