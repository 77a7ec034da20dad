"""The host as `lscpu` describes it, for the benchmarks' reports (every
figure in BENCHMARKS.md names its host)."""

from __future__ import annotations

import subprocess


def lscpu() -> dict[str, str]:
    """lscpu's fields by name ("Vendor ID", "Model name", "CPU family",
    "Model", "Flags", ...); {} where lscpu cannot run."""
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in info.splitlines())}


def flags(fields: dict[str, str]) -> set[str]:
    """The CPU's instruction-set flags."""
    return set(fields.get("Flags", "").split())
