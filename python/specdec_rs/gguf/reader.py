"""A GGUF file's header, metadata and tensors, read without loading them:
each tensor knows where its bytes sit, in the file's own format. Every
count, offset and size is checked against the file's size
as it is read, so a truncated or corrupt file is a ValueError naming the
file (and the tensor), never an exception from deep inside, a huge
allocation or a hang.

Only what a model needs is decoded: scalar and string metadata; numeric
arrays stay read-only NumPy views of the mapped file (no copy: a large
array costs no memory until read); string arrays (the tokenizer's
vocabulary and merges) are skipped over (their sizes checked), which keeps
reading a file to milliseconds. Each key's GGUF value type is kept, so a
model's keys are read with their type checked (`GGUFFile.integer`,
`real`, `text`: a bool, a float or an array where an integer belongs is
refused, never converted). Tensor offsets must be multiples of the
alignment and tensors may not overlap, as the format requires.
The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
MAX_TENSORS = 1 << 20
MAX_KEYS = 1 << 20
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, elements per block, bytes per block); gguf-py's table
# for the types this project reads or names in an error
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
}

# GGUF value types: id -> struct format (scalars), 8 = string, 9 = array
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "|b1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


@dataclass(frozen=True)
class Tensor:
    """One tensor: `shape` as ggml orders it (ne[0] first: the row length),
    `rows`/`row_length` for a 2-D weight (out, in), where its bytes sit in
    the file, and `data`: those bytes (rows, bytes per row), read from the
    file when asked (not mapped: the loader packs each tensor and drops it,
    so the file's pages never count in the process's memory)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    path: Path
    offset: int
    row_bytes: int

    @property
    def data(self) -> np.ndarray:
        out = np.fromfile(
            self.path, dtype=np.uint8, count=self.rows * self.row_bytes, offset=self.offset
        )
        if len(out) != self.rows * self.row_bytes:
            raise ValueError(
                f"GGUF file {self.path} changed while it was read (tensor {self.name})"
            )
        return out.reshape(self.rows, self.row_bytes)

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]

    @property
    def row_length(self) -> int:
        return self.shape[0]

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1


INTEGER_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})  # u8 i8 u16 i16 u32 i32 u64 i64
FLOAT_TYPES = frozenset({6, 12})  # f32 f64
TYPE_NAMES = {
    0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
    8: "string", 9: "array", 10: "u64", 11: "i64", 12: "f64",
}  # fmt: skip


@dataclass(frozen=True)
class GGUFFile:
    """A read GGUF file: its metadata (key -> value; numeric arrays as
    read-only NumPy arrays, string arrays as their length, decoded on
    demand by `strings`), each key's GGUF value type (`types`; an array's
    item type in `items`), where each value's bytes sit (`spans`: key ->
    [start, end), read back by `raw`), and tensors (name -> `Tensor`)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, Tensor] = field(repr=False)
    types: dict[str, int] = field(default_factory=dict, repr=False)
    items: dict[str, int] = field(default_factory=dict, repr=False)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def raw(self, key: str) -> bytes:
        """The bytes of key `key`'s value as the file holds them (after its
        type; an array's item type and length included); KeyError if absent."""
        start, end = self.spans[key]
        return np.memmap(self.path, mode="r", dtype=np.uint8)[start:end].tobytes()

    def strings(self, key: str) -> list[str]:
        """The string array `key`, decoded from the file (its bounds were
        checked when it was read); KeyError if `key` is not one."""
        if self.types.get(key) != 9 or self.items.get(key) != 8:
            raise KeyError(key)
        # its first string after the value's item type (u32) and count (u64)
        at, count = self.spans[key][0] + 12, int(self.metadata[key])
        buf = np.memmap(self.path, mode="r", dtype=np.uint8)
        view = memoryview(buf)  # type: ignore[arg-type]  # a memmap is a buffer
        out = []
        for i in range(count):
            n = struct.unpack_from("<Q", view, at)[0]
            try:
                out.append(bytes(view[at + 8 : at + 8 + n]).decode("utf-8"))
            except UnicodeDecodeError:
                raise self.fail(f"string {i} of {key} is not UTF-8", "replace the file") from None
            at += 8 + n
        return out

    def fail(self, what: str, fix: str = "") -> ValueError:
        return ValueError(f"GGUF file {self.path}: {what}" + (f"; {fix}" if fix else ""))

    def _wrong(self, key: str, expected: str, fix: str) -> ValueError:
        kind = TYPE_NAMES.get(self.types.get(key, -1), "?")
        return self.fail(
            f"metadata {key} = {self.metadata[key]!r} ({kind}); expected {expected}", fix
        )

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 0, maximum: int, fix: str = ""
    ) -> int:
        """Key `key` as an integer of an integer GGUF type in [minimum, maximum]
        (`default` when absent; absent without one is a ValueError)."""
        if key not in self.metadata:
            if default is None:
                raise self.fail(f"metadata {key} is missing", fix)
            return default
        value = self.metadata[key]
        if self.types.get(key) not in INTEGER_TYPES or not minimum <= value <= maximum:
            raise self._wrong(key, f"an integer in [{minimum}, {maximum}]", fix)
        return int(value)

    def real(
        self,
        key: str,
        default: float | None = None,
        *,
        above: float = 0.0,
        maximum: float = float("inf"),
        fix: str = "",
    ) -> float:
        """Key `key` as a finite number of a float (or integer) GGUF type in
        (above, maximum]; a bool, string or array is refused."""
        if key not in self.metadata:
            if default is None:
                raise self.fail(f"metadata {key} is missing", fix)
            return default
        value = self.metadata[key]
        kind = self.types.get(key)
        numeric = kind in FLOAT_TYPES or kind in INTEGER_TYPES
        if not numeric or not math.isfinite(value) or not above < value <= maximum:
            raise self._wrong(key, f"a finite number in ({above}, {maximum}]", fix)
        return float(value)

    def text(self, key: str, default: str | None = None, *, fix: str = "") -> str | None:
        """Key `key` as a string (`default` when absent)."""
        if key not in self.metadata:
            return default
        if self.types.get(key) != 8:
            raise self._wrong(key, "a string", fix)
        return str(self.metadata[key])


class _Cursor:
    """Reads little-endian values from the memory map, every read bounds-checked."""

    def __init__(self, buf: np.ndarray, path: Path):
        self.buf, self.path, self.at = buf, path, 0
        self.view = memoryview(buf)  # type: ignore[arg-type]  # a memmap is a buffer
        self.items: dict[str, int] = {}  # an array's item type, by what it is

    def fail(self, what: str) -> ValueError:
        return ValueError(
            f"GGUF file {self.path} is corrupt or truncated ({what} at byte {self.at:,} of "
            f"{len(self.buf):,}); replace the file"
        )

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > len(self.buf):
            raise self.fail(f"{what} runs past the end")
        out = self.buf[self.at : self.at + n].tobytes()
        self.at += n
        return out

    def scalar(self, kind: int, what: str) -> Any:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return int(self.scalar(4, what))

    def u64(self, what: str) -> int:
        return int(self.scalar(10, what))

    def string(self, what: str) -> str:
        n = self.u64(f"{what}'s length")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, kind: int, what: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, what)
        if kind == 8:
            return self.string(what)
        if kind != 9:
            raise self.fail(f"{what} has value type {kind}, which GGUF does not define")
        item = self.u32(f"{what}'s item type")
        count = self.u64(f"{what}'s length")
        self.items[what] = item
        if item in _NUMPY:
            size = np.dtype(_NUMPY[item]).itemsize
            if count * size > len(self.buf) - self.at:
                raise self.fail(f"{what} ({count:,} items) runs past the end")
            at = self.at
            self.at = at + count * size
            values = np.frombuffer(self.view[at : self.at], dtype=_NUMPY[item])
            return values  # a read-only view of the map: no copy
        if item == 8:  # a string array: skipped over, its length kept
            end, at = len(self.buf), self.at
            if count > (end - at) // 8:
                raise self.fail(f"{what} ({count:,} strings) runs past the end")
            for _ in range(count):
                if at + 8 > end:
                    at = end + 1
                    break
                at += 8 + struct.unpack_from("<Q", self.view, at)[0]
            if at > end:
                raise self.fail(f"{what} ({count:,} strings) runs past the end")
            self.at = at
            return count
        raise self.fail(f"{what} is an array of type {item}, which this reader does not decode")


def read(path: Any) -> GGUFFile:
    """The header, metadata and tensor views of the GGUF file at `path` (a
    `GGUFFile` already read is returned as it is: callers take either)."""
    if isinstance(path, GGUFFile):
        return path
    p = Path(os.fspath(path)).expanduser()
    if not p.is_file():
        raise ValueError(f"GGUF file {p} does not exist (or is a folder); pass a .gguf file")
    try:
        buf = np.memmap(p, mode="r", dtype=np.uint8)
    except (OSError, ValueError) as e:
        raise ValueError(f"GGUF file {p} cannot be read ({e})") from None
    c = _Cursor(buf, p)
    if c.take(4, "the magic") != MAGIC:
        raise ValueError(f"{p} is not a GGUF file (it does not start with b'GGUF')")
    version = c.u32("the version")
    if version not in (2, 3):
        raise ValueError(f"GGUF file {p} has version {version}; this reader reads versions 2 and 3")
    n_tensors, n_keys = c.u64("the tensor count"), c.u64("the key count")
    if n_tensors > MAX_TENSORS or n_keys > MAX_KEYS:
        raise c.fail(f"{n_tensors:,} tensors and {n_keys:,} keys are more than any model has")
    metadata: dict[str, Any] = {}
    types: dict[str, int] = {}
    spans: dict[str, tuple[int, int]] = {}
    for i in range(n_keys):
        key = c.string(f"key {i}")
        types[key] = c.u32(f"the type of {key}")
        start = c.at
        metadata[key] = c.value(types[key], key)
        spans[key] = (start, c.at)
    infos = []
    for i in range(n_tensors):
        name = c.string(f"tensor {i}'s name")
        dims = c.u32(f"{name}'s dimension count")
        if not 1 <= dims <= MAX_DIMS:
            raise c.fail(f"tensor {name} has {dims} dimensions")
        shape = tuple(c.u64(f"{name}'s shape") for _ in range(dims))
        ggml_type = c.u32(f"{name}'s type")
        offset = c.u64(f"{name}'s offset")
        infos.append((name, shape, ggml_type, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        "general.alignment" in metadata and types["general.alignment"] not in INTEGER_TYPES
    ) or not (isinstance(alignment, int) and alignment >= 1 and not alignment & (alignment - 1)):
        raise ValueError(
            f"GGUF file {p}: general.alignment = {alignment!r} is not a power of 2 of an "
            "integer type; replace the file"
        )
    start = -(-c.at // alignment) * alignment
    tensors = {}
    for name, shape, ggml_type, offset in infos:
        if offset % alignment:
            raise ValueError(
                f"GGUF file {p}: tensor {name}'s offset {offset:,} is not a multiple of the "
                f"alignment {alignment}; replace the file"
            )
        if name in tensors:
            raise ValueError(f"GGUF file {p}: tensor {name} appears twice; replace the file")
        tensors[name] = _tensor(p, buf, name, shape, ggml_type, start + offset)
    _no_overlaps(p, list(tensors.values()))
    return GGUFFile(p, version, metadata, tensors, types, c.items, spans)


def _no_overlaps(p: Path, tensors: list[Tensor]) -> None:
    """Each tensor's bytes end before the next one's begin."""
    spans = sorted((t.offset, t.offset + t.rows * t.row_bytes, t.name) for t in tensors)
    for (_, end, name), (start, _, other) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise ValueError(
                f"GGUF file {p}: tensors {name} and {other} overlap (bytes {start:,} to "
                f"{end:,}); replace the file"
            )


def _tensor(
    p: Path, buf: np.ndarray, name: str, shape: tuple[int, ...], ggml_type: int, at: int
) -> Tensor:
    if ggml_type not in GGML_TYPES:
        raise ValueError(
            f"GGUF file {p}: tensor {name} has ggml type {ggml_type}, which is unknown"
        )
    type_name, elems, size = GGML_TYPES[ggml_type]
    if any(d == 0 for d in shape) or shape[0] % elems:
        raise ValueError(
            f"GGUF file {p}: tensor {name} has shape {list(shape)}; a {type_name} row holds "
            f"whole blocks of {elems} values"
        )
    rows = int(np.prod(shape[1:], dtype=object)) if len(shape) > 1 else 1
    row_bytes = shape[0] // elems * size
    end = at + rows * row_bytes
    if end > len(buf):
        raise ValueError(
            f"GGUF file {p} is truncated: tensor {name} ({type_name} {list(shape)}) ends at byte "
            f"{end:,}, past the file's {len(buf):,}; replace the file"
        )
    return Tensor(name, ggml_type, shape, p, at, row_bytes)
