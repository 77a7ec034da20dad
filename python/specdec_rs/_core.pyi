"""The Rust core (specdec_rs._core). Use the wrappers in specdec_rs, which
convert torch tensors, lists and mixed dtypes, check arguments and choose the
row-sum tolerances."""

from typing import final

import numpy as np
import numpy.typing as npt

__all__ = [
    "LlamaStack",
    "Simulation",
    "SuffixTrie",
    "CHILDREN",
    "METHODS",
    "MAX_THREADS",
    "accept_gathered",
    "finish_round",
    "linear_f32",
    "linear_vectorized",
    "llama_layer",
    "dequantize_rows",
    "dequantize_transposed",
    "fma_peak",
    "layer_profile",
    "layer_profile_totals",
    "pack_rows",
    "panel_rows",
    "read_bandwidth",
    "pack_weight",
    "quantize_q8",
    "masked_logits",
    "qlinear",
    "qlinear_path",
    "unpack_rows",
    "VARIANTS",
    "__version__",
    "row_seed",
    "TREE_VARIANTS",
    "verify",
    "verify_batch",
    "verify_tree",
]

VARIANTS: list[str]
TREE_VARIANTS: list[str]
CHILDREN: list[str]
METHODS: list[str]
MAX_THREADS: int
__version__: str

def verify(
    p_rows: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    q_rows: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    drafts: npt.NDArray[np.int64],
    seed: int,
    full: bool = True,
    p_tol: float | None = None,
    q_tol: float | None = None,
    method: str = "token",
) -> npt.NDArray[np.int64]: ...
def verify_batch(
    p: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    q: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    drafts: npt.NDArray[np.int64],
    seed: int,
    full: bool = True,
    p_tol: float | None = None,
    q_tol: float | None = None,
    threads: int | None = None,
    method: str = "token",
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
def verify_tree(
    p_rows: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    q_rows: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    tokens: npt.NDArray[np.int64],
    parents: npt.NDArray[np.int64],
    seed: int,
    children: str = "iid",
    full: bool = False,
    p_tol: float | None = None,
    q_tol: float | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...

@final
class Simulation:
    def __new__(
        cls,
        p_table: npt.NDArray[np.float64],
        q_table: npt.NDArray[np.float64],
        *,
        start: int,
        seed: int,
        variant: str = "exact",
        k: int | None = None,
        parents: npt.NDArray[np.int64] | None = None,
        children: str = "iid",
        p_tol: float | None = None,
        q_tol: float | None = None,
    ) -> Simulation: ...
    def histogram(
        self, runs: int, num_tokens: int, threads: int | None = None
    ) -> npt.NDArray[np.int64]: ...
    def round_lengths(self, rounds: int, threads: int | None = None) -> npt.NDArray[np.int64]: ...

@final
class LlamaStack:
    def __new__(
        cls,
        layers: list[
            tuple[
                list[tuple[npt.NDArray[np.uint8], int]],
                npt.NDArray[np.float32],
                npt.NDArray[np.float32],
                tuple[int, int, int, int, float, int, float, float, bool, int],
                tuple[
                    npt.NDArray[np.float32] | None,
                    tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None,
                    tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None,
                ],
            ]
        ],
        norm: npt.NDArray[np.float32],
        eps: float,
        head: tuple[npt.NDArray[np.uint8], int],
        vocab: int,
        softcap: float,
    ) -> LlamaStack: ...
    def forward(
        self,
        x: npt.NDArray[np.float32],
        cos: npt.NDArray[np.float32],
        sin: npt.NDArray[np.float32],
        keys: list[npt.NDArray[np.float32] | npt.NDArray[np.float16] | npt.NDArray[np.uint8]],
        values: list[npt.NDArray[np.float32] | npt.NDArray[np.float16] | npt.NDArray[np.uint8]],
        pasts: list[int],
        lengths: list[int],
        mask: npt.NDArray[np.uint8] | None,
        rows: list[int],
        threads: int,
        path: str | None = None,
        activations: str = "f32",
        local: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None,
        panels: list[list[int] | None] | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...

@final
class SuffixTrie:
    def __new__(cls, depth: int) -> SuffixTrie: ...
    @property
    def depth(self) -> int: ...
    def __len__(self) -> int: ...
    def grow(self, suffixes: list[int], tokens: list[int]) -> list[int]: ...
    def remove(self, tokens: list[int]) -> None: ...
    def find(self, pattern: list[int]) -> int | None: ...
    def longest_match(self, seq: list[int], max_match: int) -> tuple[int | None, int]: ...
    def chain(self, node: int, limit: int, min_prob: float) -> tuple[list[int], list[float]]: ...
    def tree(
        self, node: int, limit: int, budget: int, min_prob: float
    ) -> tuple[list[int], list[int]]: ...
    def count(self, node: int) -> int: ...
    def total(self, node: int) -> int: ...
    def best(self, node: int) -> int | None: ...
    def children(self, node: int) -> list[tuple[int, int]]: ...

def row_seed(seed: int, index: int) -> int: ...
def accept_gathered(px: npt.NDArray[np.float64], qx: npt.NDArray[np.float64], seed: int) -> int: ...
def finish_round(
    p_row: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    q_row: npt.NDArray[np.float32] | npt.NDArray[np.float64],
    m: int,
    k: int,
    seed: int,
    p_tol: float | None = None,
    q_tol: float | None = None,
) -> int: ...
def linear_f32(
    x: npt.NDArray[np.float32], w: npt.NDArray[np.float32], out: npt.NDArray[np.float32]
) -> None: ...
def linear_vectorized() -> bool: ...
def pack_weight(w: npt.NDArray[np.uint8], qtype: int, k: int) -> npt.NDArray[np.uint8]: ...
def qlinear(
    x: npt.NDArray[np.float32],
    packed: npt.NDArray[np.uint8],
    qtype: int,
    m: int,
    out: npt.NDArray[np.float32],
    threads: int,
    path: str | None = None,
    activations: str = "f32",
) -> None: ...
def dequantize_rows(
    packed: npt.NDArray[np.uint8],
    qtype: int,
    k: int,
    m: int,
    rows: npt.NDArray[np.int64],
    out: npt.NDArray[np.float32],
    threads: int = 1,
) -> None: ...
def unpack_rows(
    packed: npt.NDArray[np.uint8], qtype: int, k: int, m: int, rows: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint8]: ...
def dequantize_transposed(
    packed: npt.NDArray[np.uint8],
    qtype: int,
    k: int,
    m: int,
    out: npt.NDArray[np.float32],
    threads: int = 1,
) -> None: ...
def quantize_q8(
    x: npt.NDArray[np.float32], with_s: bool
) -> tuple[
    npt.NDArray[np.int8], npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.int32]
]: ...
def masked_logits(
    logits: npt.NDArray[np.float32], allowed: npt.NDArray[np.bool_], vocab: int
) -> npt.NDArray[np.float32]: ...
def pack_rows() -> int: ...
def panel_rows() -> int: ...
def layer_profile(on: bool) -> None: ...
def layer_profile_totals() -> list[tuple[str, float]]: ...
def read_bandwidth(bytes: int, threads: int, repeats: int = 5) -> float: ...
def fma_peak(threads: int) -> float: ...
def llama_layer(
    x: npt.NDArray[np.float32],
    cos: npt.NDArray[np.float32],
    sin: npt.NDArray[np.float32],
    keys: list[npt.NDArray[np.float32] | npt.NDArray[np.float16] | npt.NDArray[np.uint8]],
    values: list[npt.NDArray[np.float32] | npt.NDArray[np.float16] | npt.NDArray[np.uint8]],
    pasts: list[int],
    lengths: list[int],
    mask: npt.NDArray[np.uint8] | None,
    weights: list[tuple[npt.NDArray[np.uint8], int]],
    attn_norm: npt.NDArray[np.float32],
    ffn_norm: npt.NDArray[np.float32],
    shape: tuple[int, int, int, int, float, int, float, float, bool, int],
    threads: int,
    path: str | None = None,
    activations: str = "f32",
    qkv_bias: npt.NDArray[np.float32] | None = None,
    qk_norms: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None,
    post_norms: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None,
) -> None: ...
def qlinear_path() -> str: ...
