"""The finishing steps every agentflow plot shares (headless backend, grid, legend, save)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or CI
import matplotlib.pyplot as plt  # noqa: E402


def finish_figure(fig, ax, path: str | Path, *, title: str = "", dpi: int = 120,
                  grid_axis: str = "both", legend_fontsize: float | None = None,
                  legend_ncol: int = 1, legend_outside: bool = False) -> Path:
    """Grid, legend and title, then save ``fig`` to ``path`` and free it.

    ``legend_outside`` puts the legend right of the axes, where it cannot cover bars (for
    bar charts, whose bars fill the whole plot area)."""
    ax.grid(alpha=0.3, axis=grid_axis)
    if legend_outside:
        ax.legend(fontsize=legend_fontsize, ncol=legend_ncol, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    else:
        ax.legend(fontsize=legend_fontsize, ncol=legend_ncol)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight" if legend_outside else None)
    plt.close(fig)
    return Path(path)
