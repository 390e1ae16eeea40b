"""`heatmap`: a heatmap drawn as seaborn 0.13's `seaborn.heatmap` draws it (the same mesh, limits, ticks, tick
labels, annotations and colour bar, so the same pixels), for the options the report uses, without importing
seaborn: its import brings scipy.stats, ~0.7 s of every analysis process's start-up and of the sweep-end
analysis run. `tests/test_heatmap.py` holds the two to the same figure, pixel for pixel, while seaborn is
installed (the example notebook uses it).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, Normalize

Labels = Union[str, bool, int, Sequence]


def heatmap(ax: Axes, values, *, cmap: Union[str, Colormap], columns: Optional[Sequence] = None,
            index: Optional[Sequence] = None, xticklabels: Labels = "auto", yticklabels: Labels = "auto",
            norm: Optional[Normalize] = None, vmin: Optional[float] = None, vmax: Optional[float] = None,
            cbar: bool = True, linewidths: float = 0.0, linecolor="white", annot=None, fmt: str = ".2g",
            annot_kws: Optional[dict] = None, square: bool = False) -> Axes:
    """`values` (rows × columns: an array, or a DataFrame whose index and columns name them) on `ax`: row 0 at
    the top, cell (i, j) spanning [j, j + 1] × [i, i + 1]; NaN cells left blank. `columns`, `index`: the
    columns' and rows' names (else the DataFrame's, else 0, 1, …), shown as a pandas Index holds them (as
    seaborn shows them: [1, 2.5] as 1.0 and 2.5). Tick labels, as seaborn's: "auto" (the names, every k-th
    where all would not fit), True (every name), False (none), an int k (every k-th name) or a sequence of
    labels, one per column or row. `annot`: True (the values, formatted by `fmt`) or an array of strings; the
    text is dark on light cells and white on dark ones."""
    frame = isinstance(values, pd.DataFrame)
    data = values.to_numpy() if frame else np.asarray(values)
    if data.ndim != 2:
        raise ValueError(f"`values` must be 2-D, not of shape {data.shape}")
    n_rows, n_cols = data.shape
    columns = _names(columns, values.columns if frame else range(n_cols))
    index = _names(index, values.index if frame else range(n_rows))
    names = (values.columns.name, values.index.name) if frame else (None, None)
    # seaborn masks what pandas calls null (NaN, None; not ±inf) and keeps the values' type (`fmt="d"` for ints)
    plot_data = np.ma.masked_where(np.asarray(pd.isnull(data)), data)
    if square:
        ax.set_aspect("equal")
    for side in ("top", "right", "left", "bottom"):  # seaborn.despine(left=True, bottom=True)
        ax.spines[side].set_visible(False)
    kws = {"linewidths": linewidths, "edgecolor": linecolor}
    if norm is None:
        calc = plot_data.astype(float).filled(np.nan)
        kws["vmin"] = np.nanmin(calc) if vmin is None else vmin
        kws["vmax"] = np.nanmax(calc) if vmax is None else vmax
    else:
        kws["norm"] = norm
    mesh = ax.pcolormesh(plot_data, cmap=mpl.colormaps[cmap] if isinstance(cmap, str) else cmap, **kws)
    ax.set(xlim=(0, n_cols), ylim=(0, n_rows))
    ax.invert_yaxis()
    if cbar:
        ax.figure.colorbar(mesh, None, ax).outline.set_linewidth(0)
    xticks, xlabels = _ticks(ax, xticklabels, columns, 0)
    yticks, ylabels = _ticks(ax, yticklabels, index, 1)
    ax.set(xticks=xticks, yticks=yticks)
    xtl = ax.set_xticklabels(xlabels)
    ytl = ax.set_yticklabels(ylabels, rotation="vertical")
    for label in ytl:
        label.set_va("center")
    # seaborn draws the figure here, then turns overlapping tick labels; the report drew its heatmaps on a canvas
    # that did not draw (quadratic in the panels otherwise), so seaborn measured the labels undrawn: so does this,
    # without drawing
    if _overlap(xtl):
        for label in xtl:
            label.set_rotation("vertical")
    if _overlap(ytl):
        for label in ytl:
            label.set_rotation("horizontal")
    ax.set(xlabel="" if names[0] is None else names[0], ylabel="" if names[1] is None else names[1])
    if annot is not None and annot is not False:
        texts = plot_data if annot is True else np.asarray(annot)
        if texts.shape != data.shape:
            raise ValueError("`values` and `annot` must have the same shape")
        mesh.update_scalarmappable()
        xpos, ypos = np.meshgrid(np.arange(n_cols) + .5, np.arange(n_rows) + .5)
        for x, y, m, color, val in zip(xpos.flat, ypos.flat, mesh.get_array().flat, mesh.get_facecolors(),
                                       texts.flat):
            if m is not np.ma.masked:
                ax.text(x, y, ("{:" + fmt + "}").format(val),
                        **{"color": ".15" if _luminance(color) > .408 else "w", "ha": "center", "va": "center",
                           **(annot_kws or {})})
    return ax


def _names(given: Optional[Sequence], default) -> np.ndarray:
    """Columns' or rows' names as a pandas Index holds them (seaborn's tick labels are its values)."""
    return pd.Index(default if given is None else list(given)).values


def _ticks(ax: Axes, labels: Labels, names, axis: int) -> tuple[list, list]:
    """Tick positions (cell centres) and their labels, as seaborn places them."""
    if labels is False:
        return [], []
    if labels is True:
        labels = names
    elif isinstance(labels, (int, np.integer)):  # every k-th name
        return list(np.arange(0, len(names), labels) + .5), list(names[::labels])
    elif isinstance(labels, str):
        if labels != "auto":
            raise ValueError(f"tick labels: 'auto', True, False, an int or a sequence, not {labels!r}")
        # every k-th name, k the least that fits the axis at the tick labels' font size
        bbox = ax.get_window_extent().transformed(ax.figure.dpi_scale_trans.inverted())
        size = [bbox.width, bbox.height][axis]
        tick, = [ax.xaxis, ax.yaxis][axis].set_ticks([0])
        max_ticks = int(size // (tick.label1.get_size() / 72))
        if max_ticks < 1:
            return [], []
        every = len(names) // max_ticks + 1
        return list(np.arange(0, len(names), every) + .5), list(names[::every])
    labels = list(labels)
    return list(np.arange(len(labels)) + .5), labels


def _overlap(labels) -> bool:
    if not labels:
        return False
    boxes = [label.get_window_extent() for label in labels]
    return max(b.count_overlaps(boxes) for b in boxes) > 1


def _luminance(color) -> float:
    """Relative luminance (W3C) of an RGBA colour."""
    rgb = mpl.colors.to_rgba_array(color)[:, :3]
    rgb = np.where(rgb <= .03928, rgb / 12.92, ((rgb + .055) / 1.055) ** 2.4)
    return float(rgb.dot([.2126, .7152, .0722])[0])
