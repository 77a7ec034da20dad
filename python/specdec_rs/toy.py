"""The handout's toy models, defined once. p = target, q = draft.

CHAIN_P, CHAIN_Q: the 3-token Markov chain of the handout's tests (row r is
the distribution after token r): α = 0.6 after token 0, 0.5 after 1 and 2.
EXACT_PAIRS[a, b] = p(a | 0) p(b | a): the exact law of the first two tokens
after token 0.
IID_P, IID_Q: the prefix-independent pair with α = 0.8, as (1, 3) tables.
"""

from __future__ import annotations

import numpy as np

CHAIN_P = np.array([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
CHAIN_Q = np.array([[0.2, 0.5, 0.3], [0.4, 0.4, 0.2], [0.1, 0.8, 0.1]])
EXACT_PAIRS = CHAIN_P[0][:, None] * CHAIN_P

IID_P = np.array([[0.5, 0.3, 0.2]])
IID_Q = np.array([[0.3, 0.3, 0.4]])

# The handout's test constants: TV < 0.015 over 30,000 runs of two tokens.
TV_RUNS = 30_000
TV_THRESHOLD = 0.015
