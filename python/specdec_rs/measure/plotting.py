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
    """Tight layout, 120 dpi, and free the figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
