"""matplotlib without a display, for the PNGs the commands write."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (imported lazily: an optional extra)."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plots need matplotlib: pip install 'specdec_rs[hf]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path) -> None:
    """Tight layout, 120 dpi, written atomically (the format from the
    suffix, PNG without one), and free the figure."""
    from specdec_rs import _files

    fig.tight_layout()
    with _files.atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, format=Path(path).suffix.lstrip(".").lower() or "png")
    pyplot().close(fig)
