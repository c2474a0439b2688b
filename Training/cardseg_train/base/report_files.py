"""Writing the training tools' report files: values formatted for tables, files written
atomically (to a temporary name, then renamed), matplotlib figures saved as PNG.

Shared by the calibration, review and indices reports; nothing here knows what a report holds.
Each file written is noted in the running ``--out`` record, if any
(:func:`cardseg_train.base.out_record.note_written`).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Optional

from cardseg_train.base.out_record import note_written


def format_value(v: Optional[float], scale: float = 1.0, digits: int = 3) -> str:
    """``v * scale`` with ``digits`` decimals; ``n/a`` for a missing or non-finite value."""
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v * scale:.{digits}f}"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it into place (never a half-written file;
    :func:`cardseg.base.files.write_atomic`), then note it in the running ``--out`` record."""
    from cardseg.base.files import write_atomic

    write_atomic(Path(path), data)
    note_written(path)


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Save ``fig`` as PNG (``dpi``, default 110) atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    atomic_write(path, buf.getvalue())
    return path


def save_titled(fig, path: Path, title: str = "") -> Path:
    """Optional figure title, tight layout, parent folder made, saved atomically."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)
