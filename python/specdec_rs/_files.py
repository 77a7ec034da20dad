"""Reading and writing the project's own files (head files, training shards,
checkpoints, manifests, prompts files), as `_checks` is for arguments.

Reading: every field is typed and range-checked, and a safetensors file's
layout (names, dtypes, shapes, offsets against the file's size) is read from
its header before any tensor is allocated. Each failure is one ValueError
that names the file, the field, what was expected and the fix.

Writing: atomic everywhere. A file or folder is written under a temporary
name in the same folder, then renamed over the old one, so a reader sees the
old or the new version, never half of one.

Over 400 lines on purpose: every file format's reading shares the same
checked primitives and error wording (`problem`, `Fields`, `Layout`);
split, the formats would drift apart in how they report a bad file.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_rs import _checks

REBUILT = "delete it; it is rebuilt on the next run"
JSON_LIMIT = 64 * 2**20  # bytes: no JSON file of ours comes near this
HEADER_LIMIT = 100 * 2**20  # bytes: safetensors' own limit on a header

# safetensors dtype names and their sizes in bytes
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
INTEGER_DTYPES = ("I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")


def cache_dir() -> Path:
    """Where converted models, heads and training data live: $SPECDEC_CACHE,
    else ~/.cache/specdec_rs."""
    root = os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec_rs"
    return Path(root)


def problem(path: Any, what: str, fix: str) -> ValueError:
    """The one error of this module: `path: what; fix` (`what; fix` when
    path is None: text that came from no file)."""
    return ValueError(f"{what}; {fix}" if path is None else f"{path}: {what}; {fix}")


# ---- reading -----------------------------------------------------------------------------


def existing_file(path: Any, *, what: str, fix: str) -> Path:
    """`path`, which must name a file (not a folder, not missing)."""
    p = Path(os.fspath(path))
    if not p.is_file():
        kind = "a folder" if p.is_dir() else "missing"
        raise problem(p, f"the {what} is {kind}; expected a file", fix)
    return p


def read_bytes(path: Any, *, what: str, fix: str, limit: int = JSON_LIMIT) -> bytes:
    """The bytes of a file that exists, is a file and is at most `limit` bytes."""
    p = existing_file(path, what=what, fix=fix)
    size = p.stat().st_size
    if size > limit:
        raise problem(p, f"the {what} is {size:,} bytes; expected at most {limit:,}", fix)
    try:
        return p.read_bytes()
    except OSError as e:
        raise problem(p, f"the {what} cannot be read ({e.strerror})", fix) from None


def read_text(path: Any, *, what: str, fix: str, limit: int = JSON_LIMIT) -> str:
    """A UTF-8 text file (a leading byte-order mark is dropped), whose text
    encodes back to UTF-8 (no lone surrogates)."""
    data = read_bytes(path, what=what, fix=fix, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise problem(path, f"the {what} is not UTF-8 text (byte {e.start})", fix) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str | bytes, *, where: Any, what: str, fix: str) -> Any:
    """Strict JSON (NaN and Infinity refused, nesting deeper than the
    parser's recursion a ValueError too), with the position of a fault."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise problem(
            where, f"the {what} is not JSON ({e.msg} at line {e.lineno}, column {e.colno})", fix
        ) from None
    except (ValueError, RecursionError) as e:
        raise problem(where, f"the {what} is not strict JSON ({e})", fix) from None


def read_json(path: Any, *, what: str, fix: str) -> Any:
    """A strict JSON file (see `parse_json`)."""
    return parse_json(read_text(path, what=what, fix=fix), where=path, what=what, fix=fix)


def json_safe(x: Any) -> Any:
    """NaN -> None, recursively through dicts (keys as strings), lists and
    tuples: JSON has no NaN."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def to_json(obj: Any, *, what: str, indent: int | None = None) -> str:
    """Strict JSON text: a NaN or an infinity is a ValueError naming `what`,
    never a literal that strict parsers refuse."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError:
        raise ValueError(
            f"{what} holds a NaN or an infinity ({_first_non_finite(obj)}); nothing was written"
        ) from None


def _first_non_finite(obj: Any, at: str = "") -> str:
    if isinstance(obj, float) and not math.isfinite(obj):
        return f"{at or 'the value'} = {obj}"
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for key, value in items:
        found = _first_non_finite(value, f"{at}.{key}" if at else str(key))
        if found:
            return found
    return ""


class Fields:
    """Typed access to one JSON object read from `path`: each getter checks
    the field's type and range with `_checks` and names the file, the field
    and the fix when it fails.

    >>> Fields({"n": 3}, "f.json", "a test file", "fix it").integer("n", maximum=5)
    3
    """

    def __init__(self, obj: Any, path: Any, what: str, fix: str, where: str = ""):
        self.path, self.what, self.fix, self.where = path, what, fix, where
        if not isinstance(obj, dict):
            name = self._name("") or f"the {what}"
            raise problem(path, f"{name} is a JSON {_json_kind(obj)}; expected an object", fix)
        self.obj: dict[str, Any] = obj

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where and key else self.where or key

    def has(self, key: str) -> bool:
        return key in self.obj

    def raw(self, key: str) -> Any:
        if key not in self.obj:
            raise problem(self.path, f"the {self.what} has no field {self._name(key)!r}", self.fix)
        return self.obj[key]

    def _checked(self, key: str, check: Callable[[Any, str], Any]) -> Any:
        value = self.raw(key)
        try:
            return check(value, f"field {self._name(key)}")
        except ValueError as e:
            raise problem(self.path, str(e), self.fix) from None

    def integer(self, key: str, *, minimum: int = 0, maximum: int | None = None) -> int:
        return int(
            self._checked(key, lambda v, n: _checks.integer(v, n, minimum=minimum, maximum=maximum))
        )

    def real(self, key: str, **bounds: Any) -> float:
        return float(self._checked(key, lambda v, n: _checks.real(v, n, **bounds)))

    def boolean(self, key: str) -> bool:
        return bool(self._checked(key, _checks.boolean))

    def string(self, key: str, options: tuple[str, ...] | None = None) -> str:
        def check(value: Any, name: str) -> str:
            if options is not None:
                return _checks.choice(value, name, options)
            if not isinstance(value, str):
                raise ValueError(f"{name} = {value!r} is a {_json_kind(value)}; expected a string")
            return value

        return str(self._checked(key, check))

    def mapping(self, key: str) -> Fields:
        return Fields(self.raw(key), self.path, self.what, self.fix, self._name(key))


def _json_kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


# ---- safetensors layouts -------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file: its dtype name ("F32", "I64", ...) and shape."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """What a safetensors file holds, read from its header alone: the tensors
    (name -> dtype, shape) and the metadata strings. `path`, `what` and `fix`
    name the file in errors."""

    path: str
    what: str
    fix: str
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]

    def fail(self, what: str) -> ValueError:
        return problem(self.path, what, self.fix)

    def tensor(
        self,
        name: str,
        *,
        dtypes: tuple[str, ...],
        ndim: int | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> TensorInfo:
        """The tensor `name`, which must exist with one of `dtypes` and the
        given number of dimensions or exact shape."""
        info = self.tensors.get(name)
        if info is None:
            raise self.fail(f"the {self.what} has no tensor {name!r}")
        if info.dtype not in dtypes:
            raise self.fail(
                f"tensor {name!r} has dtype {info.dtype}; expected {' or '.join(dtypes)}"
            )
        if ndim is not None and len(info.shape) != ndim:
            raise self.fail(
                f"tensor {name!r} has shape {list(info.shape)}; expected {ndim} dimensions"
            )
        if shape is not None and info.shape != shape:
            raise self.fail(f"tensor {name!r} has shape {list(info.shape)}; expected {list(shape)}")
        return info

    def exactly(self, names: set[str]) -> None:
        """The file holds these tensors and no others."""
        missing, extra = sorted(names - set(self.tensors)), sorted(set(self.tensors) - names)
        if missing or extra:
            parts = ([f"no tensor {', '.join(missing)}"] if missing else []) + (
                [f"unexpected tensor {', '.join(extra)}"] if extra else []
            )
            raise self.fail(f"the {self.what} has {' and '.join(parts)}")


def safetensors_layout(path: Any, *, what: str, fix: str) -> Layout:
    """The layout of a safetensors file, checked against the file's size:
    a header that parses, every tensor a known dtype and a shape of
    non-negative sizes, its byte range of the right length, the ranges
    back to back and ending at the end of the file (so a truncated or padded
    file is refused before anything is read)."""
    p = existing_file(path, what=what, fix=fix)
    size = p.stat().st_size
    try:
        with p.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if n < 2 or n > min(HEADER_LIMIT, size - 8):
                raise problem(p, f"the {what} is not a safetensors file (header size {n})", fix)
            raw = f.read(n)
    except OSError as e:
        raise problem(p, f"the {what} cannot be read ({e.strerror})", fix) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise problem(p, f"the {what}'s header is not UTF-8", fix) from None
    header = parse_json(text, where=p, what=f"{what}'s header", fix=fix)
    if not isinstance(header, dict):
        raise problem(p, f"the {what}'s header is not a JSON object", fix)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise problem(p, f"the {what}'s metadata is not a map of strings", fix)
    tensors, ranges = {}, []
    for name, entry in header.items():
        info, begin, end = _tensor_entry(p, what, fix, name, entry)
        tensors[name] = info
        ranges.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(ranges):
        if begin != at:
            raise problem(p, f"tensor {name!r} starts at byte {begin}, expected {at}", fix)
        at = end
    if at != size - 8 - n:
        raise problem(
            p, f"the {what} holds {size - 8 - n:,} bytes of data; its header says {at:,}", fix
        )
    return Layout(str(p), what, fix, tensors, dict(meta))


def _tensor_entry(
    p: Path, what: str, fix: str, name: str, entry: Any
) -> tuple[TensorInfo, int, int]:
    ok = isinstance(entry, dict) and entry.get("dtype") in DTYPE_SIZES
    shape, offsets = (entry.get("shape"), entry.get("data_offsets")) if ok else (None, None)
    ok = ok and isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
    ints = (shape or []) + (offsets or [])
    if not ok or not all(type(x) is int and x >= 0 for x in ints) or len(shape) > 8:  # type: ignore[arg-type]
        raise problem(p, f"the {what}'s header entry for {name!r} is malformed", fix)
    count = math.prod(shape)  # type: ignore[arg-type]
    begin, end = offsets  # type: ignore[misc]
    if end - begin != count * DTYPE_SIZES[entry["dtype"]]:
        raise problem(
            p,
            f"tensor {name!r} spans {end - begin} bytes; its shape {shape} needs "
            f"{count * DTYPE_SIZES[entry['dtype']]}",
            fix,
        )
    return TensorInfo(entry["dtype"], tuple(shape)), begin, end  # type: ignore[arg-type]


def load_tensors(layout: Layout) -> dict[str, Any]:
    """The tensors of a file whose layout was checked (torch, on the CPU)."""
    from safetensors.torch import load_file

    try:
        return load_file(layout.path)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise layout.fail(f"the {layout.what} cannot be read ({e})") from None


# ---- writing -------------------------------------------------------------------------------


def partial_path(path: Path) -> Path:
    """The temporary name beside `path` that a write goes to first."""
    return path.with_name(f"{path.name}.partial-{os.getpid()}")


@contextmanager
def atomic_file(path: Any) -> Iterator[Path]:
    """Yields a temporary path beside `path`; the caller writes it, and on
    success it is renamed over `path` (on failure removed)."""
    final = Path(os.fspath(path))
    tmp = partial_path(final)
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Any, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Any, obj: Any, *, what: str, indent: int | None = 1) -> None:
    """Write `obj` as strict JSON (`to_json`) to `path` atomically."""
    write_text(path, to_json(obj, what=what, indent=indent))


def replace_dir(source: Path, final: Path) -> None:
    """Rename the finished folder `source` to `final`: the old `final` is
    moved aside first and removed after, so `final` is always whole."""
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(source, final)
    shutil.rmtree(old, ignore_errors=True)


def place_dir(source: Path, final: Path) -> None:
    """Rename the finished folder `source` to `final` unless a folder is
    there already (another process placed one while this one built its
    own: it is left as it is, whole, and `source` is removed). For caches
    keyed by content, where any whole folder of that name is as good as
    another; `replace_dir` replaces."""
    try:
        os.rename(source, final)  # a non-empty folder there: refused, not replaced
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(source, ignore_errors=True)


def new_output_file(path: Any, name: str, *, reserved: tuple[str, ...] = ()) -> Path:
    """A file path to write later, checked before any work: not empty, not a
    folder, its folder created if needed and writable (a probe file is
    created and removed there), and not ending in one of `reserved`
    (suffixes the writer keeps for its own files beside it)."""
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(f"{name} = {path!r}; expected a file name")
    p = Path(os.fspath(path)).expanduser()
    if p.is_dir():
        raise ValueError(
            f"{name} = {str(p)!r} is a folder; expected a file name, e.g. {p / 'head.safetensors'}"
        )
    for suffix in reserved:
        if p.name.endswith(suffix):
            raise ValueError(
                f"{name} = {str(p)!r} ends in {suffix!r}, which names the writer's own files "
                "beside it; choose another name"
            )
    folder = _checks.writable_dir(p.parent if str(p.parent) else Path("."), name)
    probe = partial_path(folder / p.name)
    try:
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{name} = {str(p)!r} cannot be written ({e.strerror})") from None
    return p
