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
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, Normalize

Labels = Union[str, bool, Sequence]


def heatmap(ax: Axes, values, *, cmap: Union[str, Colormap], columns: Optional[Sequence] = None,
            index: Optional[Sequence] = None, xticklabels: Labels = "auto", yticklabels: Labels = "auto",
            norm: Optional[Normalize] = None, vmin: Optional[float] = None, vmax: Optional[float] = None,
            cbar: bool = True, linewidths: float = 0.0, linecolor="white", annot=None, fmt: str = ".2g",
            annot_kws: Optional[dict] = None, square: bool = False) -> Axes:
    """`values` (rows × columns) on `ax`: row 0 at the top, cell (i, j) spanning [j, j + 1] × [i, i + 1]; NaN cells
    left blank. `columns`, `index`: the columns' and rows' names (default 0, 1, …), as a DataFrame's would be.
    Tick labels: "auto" (the names, every k-th where all would not fit, as seaborn does), True (every name) or a
    sequence of labels, one per column or row. `annot`: True (the values, formatted by `fmt`) or an array of strings; the text is dark on
    light cells and white on dark ones."""
    data = np.asarray(values, dtype=float)
    plot_data = np.ma.masked_where(np.isnan(data), data)  # seaborn masks what pandas calls null: NaN, not ±inf
    n_rows, n_cols = data.shape
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
    xticks, xlabels = _ticks(ax, xticklabels, range(n_cols) if columns is None else columns, 0)
    yticks, ylabels = _ticks(ax, yticklabels, range(n_rows) if index is None else index, 1)
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
    ax.set(xlabel="", ylabel="")
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


def _ticks(ax: Axes, labels: Labels, names: Sequence, axis: int) -> tuple[list, list]:
    """Tick positions (cell centres) and their labels; "auto": every k-th name, k the least that fits the axis at
    the tick labels' font size."""
    if labels is True:
        labels = names
    if not isinstance(labels, str):
        labels = list(labels)
        return list(np.arange(len(labels)) + .5), labels
    if labels != "auto":
        raise ValueError(f"tick labels: 'auto', True or a sequence, not {labels!r}")
    names = list(names)
    bbox = ax.get_window_extent().transformed(ax.figure.dpi_scale_trans.inverted())
    size = [bbox.width, bbox.height][axis]
    tick, = [ax.xaxis, ax.yaxis][axis].set_ticks([0])
    max_ticks = int(size // (tick.label1.get_size() / 72))
    if max_ticks < 1:
        return [], []
    every = len(names) // max_ticks + 1
    return list(np.arange(0, len(names), every) + .5), names[::every]


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
