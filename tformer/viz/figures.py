"""Figures with matplotlib's file backend, written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported only when a figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


SOFTWARE = "tformer"  # the PNG's Software field: what tells tformer's figures from a user's files


def save_figure(figure, out_png: str | Path, dpi: int = 110) -> Path:
    """Write ``figure`` to ``out_png`` under a temporary name, rename it into place, close the figure."""
    out_png = Path(out_png)
    temporary = out_png.with_name(out_png.name + ".tmp.png")
    try:
        figure.savefig(temporary, dpi=dpi, metadata={"Software": SOFTWARE})
        os.replace(temporary, out_png)
    finally:
        pyplot().close(figure)
        temporary.unlink(missing_ok=True)
    return out_png


def written_by_tformer(png: str | Path) -> bool:
    """Whether ``png`` is a PNG that ``save_figure`` wrote (so a command may replace it)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(png) as image:
            return image.format == "PNG" and image.info.get("Software") == SOFTWARE
    except (OSError, UnidentifiedImageError):
        return False
