"""python -m analysis SWEEP_DIR... --out OUT_DIR [--x KEY --y KEY --row KEY --col KEY]
[--metric success] [--tol 0.02] [--paper] [--wandb]

Writes OUT_DIR/runs.parquet (one row per run), the phase diagrams (and with --paper the
paper's figures, and the random-init studies': the reading table OUT_DIR/readings.csv and .md, the escape map
with its theory overlay, the locking diagram) as PNG, and OUT_DIR/index.html.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd

from rw_sweeps.core import safefs, seal, signals
from rw_sweeps.core.console import counted, prog, shown

from rw_sweeps.core.readers import Broken

from . import claims
from .adaptive import RECORD, adaptive_figures, names_any, read_record
from .curves import curve_figures
from .escape import escape_figures
from .figures import paper_figures
from .locking import locking_figures
from .models import model_figures
from .load import load_runs
from .phase import (LABELS, TOL, add_success, add_success_step, axis_label, axis_values,
                    phase_diagram, swept_keys, theory_fails, tol_problem, undefined_note)
from .report import counts, log_to_wandb, write_report

DPI = 110


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog=prog("analysis", "rw-analysis"), description=__doc__.split("\n\n")[1])
    ap.add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP_DIR",
                    help="sweep folders (hydra.sweep.dir) or single run folders")
    ap.add_argument("--out", type=Path, required=True, help="folder for the report")
    for axis in ("x", "y", "row", "col"):
        ap.add_argument(f"--{axis}", metavar="KEY", help=f"phase-diagram {axis} (dotted "
                        "config key, e.g. data.p); default: picked from the swept keys")
    ap.add_argument("--metric", default="success",
                    help="success (rate over seeds; default), acc_norm, or any numeric column")
    ap.add_argument("--tol", type=float, default=TOL, help="success: acc >= OPT - tol")
    ap.add_argument("--paper", action="store_true",
                    help="also draw the paper's figures (sweeps made from experiment presets)")
    ap.add_argument("--wandb", action="store_true", help="log the figures to a wandb run")
    ap.add_argument("--wandb-mode", default="offline", choices=["offline", "online", "disabled"])
    ap.add_argument("--refresh", action="store_true", help="ignore the sweeps' Parquet caches")
    args = ap.parse_args(argv)
    for p in args.sweeps:
        if not p.is_dir():
            ap.error(f"not a folder: {shown(p)}")
    if args.out.is_symlink():  # the report is written into a real folder, never through a link
        ap.exit(2, f"error: --out {shown(args.out)}: is a symbolic link; give a folder that is not a link "
                   "(the report is never written through one)\n")
    if tol_problem(args.tol):  # the one rule, add_success's
        ap.error(f"--tol {args.tol:g}: {tol_problem(args.tol)}")
    out = args.out.resolve()
    blocked = next((a for a in (out, *out.parents) if a.exists() and not a.is_dir()), None)
    if blocked is not None:   # the report is a folder of files: a file at its name or above it stops mkdir
        ap.error(f"--out {shown(args.out)}: {shown(blocked)} is a file, not a folder")
    if any(out == p.resolve() for p in args.sweeps):
        ap.error(f"--out {shown(args.out)} is a sweep folder; its runs.parquet is the sweep's cache")
    axes = [a for a in (args.x, args.y, args.row, args.col) if a]
    if len(set(axes)) < len(axes):
        ap.error(f"--x/--y/--row/--col must be different keys, got {' '.join(axes)}")
    return ap, args


class UsageError(ValueError):
    """A request the runs cannot answer (an axis that is not a column, a metric that is not numeric)."""


@dataclass
class Report:
    path: Path                 # index.html
    runs: pd.DataFrame         # the runs table, with success and success_step
    skipped: list
    figures: list              # {file | df, caption, section}, in the page's order
    notes: list
    axes: tuple                # (x, y, row, col) of the first diagram


def build(sweeps, out: Path, x=None, y=None, row=None, col=None, metric: str = "success", tol: float = TOL,
          paper: bool = False, refresh: bool = False) -> Report:
    """The report of the sweeps in `out`: runs.parquet, every figure as PNG and index.html (what `python -m
    analysis` writes, and what the sweep's wandb analysis run carries)."""
    out = Path(os.path.abspath(out))
    _hold_out(out, sweeps)
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs(*sweeps, refresh=refresh, progress=False)
    notes += [str(w.message) for w in caught if w.category is UserWarning]   # cache trouble
    skipped = runs.attrs["skipped"]
    title = "rw-sweeps analysis: " + ", ".join(Path(p).name for p in sweeps)
    if skipped:
        notes.append(f"{len(skipped)} run folders skipped (unfinished, corrupt or a copy of another): "
                     "listed at the end of this page.")
    notes += [f"{s['path']}: {s['reason']}" for s in skipped if s["status"] == "copy"]
    if not len(runs):
        return Report(write_report(out, runs, skipped, [], notes, title=title), runs, skipped, [], notes,
                      (None,) * 4)

    runs = add_success(runs, tol)
    # Adaptive sweeps (hydra/sweeper=adaptive) are drawn over their continuous axes; grids as always
    records = {}
    for sweep in dict.fromkeys(runs["sweep"]):
        try:
            rec = read_record(sweep)
        except Broken as e:
            notes.append(f"{sweep}: {e.why}; drawn as a grid")
            continue
        if rec is not None and not names_any(runs[runs["sweep"] == sweep], rec):
            # sealed by this user, but another sweep's (copied here): this sweep's runs are not its points
            notes.append(f"{Path(sweep) / RECORD} names none of the sweep's runs; ignored: drawn as a grid")
        elif rec is not None:
            records[sweep] = rec
    grid = ~runs["sweep"].isin(list(records))
    # Sweeps of several data families (a circle, a binary chain, graphs…) share few axes: each family gets
    # its own phase diagrams on its own swept keys, unless the axes are given
    families = list(dict.fromkeys(runs.loc[grid, "data.name"].dropna())) if "data.name" in runs else []
    split = len(families) > 1 and not any((x, y, row, col))
    groups = [(f, grid & (runs["data.name"] == f)) for f in families] if split else [(None, grid)] if grid.any() else []
    axes = {f: _axes((x, y, row, col), runs[rows], notes, f) for f, rows in groups}
    runs = add_success_step(runs, tol)     # reads every history: after the cheap checks
    if metric not in runs.columns or not pd.api.types.is_numeric_dtype(runs[metric]):
        raise UsageError(f"--metric {metric}: not a numeric column (try success, acc_norm, "
                         "test_acc, test_kl, parent_attention)")
    notes += [n for n in [undefined_note(runs)] if n]
    lost = runs["success_step"].notna() & ~runs["success"] if "success_step" in runs else None
    if lost is not None and lost.any():
        notes.append(f"{int(lost.sum())} run(s) reached OPT − tol and then lost it (a success step, but "
                     "not a success at the last step): the success-step diagram counts them, the success "
                     "rate does not.")

    figures = []

    def save(name, caption, fig, section):
        safefs.write_with(out / f"{name}.png",
                          lambda fh: fig.savefig(fh, format="png", dpi=DPI, bbox_inches="tight"))
        plt.close(fig)
        figures.append({"file": f"{name}.png", "caption": caption, "section": section})

    for family, rows in groups:
        sub = runs[rows]
        fx, fy, frow, fcol = axes[family]
        on = " × ".join(k for k in (fx, fy) if k) + "".join(f", by {k}" for k in (frow, fcol) if k)
        on += f" ({family})" if family else ""
        suffix = f"_{family}" if family else ""
        for m in dict.fromkeys([metric, "symmetry_break_step", "success_step"]):
            if m == metric or (m in sub.columns and sub[m].notna().any()):
                fig = phase_diagram(sub, fx, fy, m, frow, fcol)
                save(f"phase_{m}{suffix}", f"{m} over {on}" + (f" (tol {tol:g})" if "success" in m else "")
                     + CAPTIONS.get(m, "") + unbroken(sub, fy), fig, "Phase diagrams")
            else:
                notes.append(f"no run{' of ' + family if family else ''} has a {m}: "
                             "its phase diagram is left out.")

    def draw_all(made, section):
        for name, caption, draw in made:
            try:
                fig = draw()
            except Exception as e:   # one odd run must not cost the rest of the report
                notes.append(f"{name} not drawn: {type(e).__name__}: {e}")
                continue
            save(name, caption, fig, section)

    draw_all(adaptive_figures(runs, records, notes), "Adaptive phase diagrams")
    draw_all(curve_figures(runs, notes), "Learning curves")
    draw_all(model_figures(runs, notes), "Models: loss against the baselines, strategies, attention")
    if paper:
        draw_all(paper_figures(runs, notes), "Paper figures")
        figures += _reading_table(runs, out)
        draw_all(escape_figures(runs, notes), "Escape map (beyond the paper)")
        draw_all(locking_figures(runs, notes), "Wrong-position locking (beyond the paper)")

    table = runs.copy()
    table.attrs = {"config_keys": runs.attrs["config_keys"]}   # skipped stays in the report
    safefs.write_with(out / "runs.parquet", lambda fh: table.to_parquet(fh, index=False))
    report = write_report(out, runs, skipped, figures, notes, title=title)
    return Report(report, runs, skipped, figures, notes, next(iter(axes.values()), (None,) * 4))


# What a diagram's cell means where a reader may doubt it
CAPTIONS = {"success_step": ". A cell's step is over the runs that reached OPT − tol at some evaluation, "
                            "also those that lost it again by the last step (reached, then lost): a "
                            "success rate of 0 beside a success step means every such run lost it",
            "symmetry_break_step": ". The first evaluated step whose attention spread exceeds 1e-3 (Thm 4.1's "
                                   "symmetric point left); runs that never broke have none"}


def unbroken(runs: pd.DataFrame, y: str | None) -> str:
    """A caption's sentence for each row of a diagram (a value of `y`) none of whose runs' attention left Thm
    4.1's symmetric point (symmetry_break_step: spread > 1e-3), outside the trap's cells: its cells are chance
    for want of steps that this sweep did not train (the default demo's Gaussian row, 50 steps), which a 0.00
    alone does not say. Runs whose predictions left the symmetric point's all the same (prediction_break_step,
    which a random init sets at step 0) are counted in it."""
    if not y or "symmetry_break_step" not in runs or y not in runs:
        return ""
    never = runs["symmetry_break_step"].isna() & (runs["status"] == "done")
    out = []
    for v, rows in runs.groupby(axis_values(runs, y), sort=False):
        if never[rows.index].all() and not theory_fails(rows).all():
            steps = pd.to_numeric(rows.get("optim.steps"), errors="coerce").dropna().unique()
            within = (f"its {counted(int(steps[0]), 'step', f'{steps[0]:g}')}" if len(steps) == 1 else
                      f"its {', '.join(f'{s:g}' for s in sorted(steps))} steps" if len(steps) else "its steps")
            out.append(f"{LABELS.get(y, y)} = {axis_label(y, v)}: no run's attention left the symmetric point "
                       f"(symmetry_break_step: attention spread > 1e-3) within {within}{_predictions(rows)}, so its "
                       "cells measure only that horizon")
    return "".join(f". {s}" for s in out)


def _predictions(rows: pd.DataFrame) -> str:
    """`, though k of n runs' predictions left the symmetric point's (prediction_break_step …)`, or ''."""
    if "prediction_break_step" not in rows:
        return ""
    broke = pd.to_numeric(rows["prediction_break_step"], errors="coerce").dropna()
    if not len(broke):
        return ""
    at = ", ".join(f"{s:g}" for s in sorted(broke.unique()))
    return (f", though {len(broke)} of {len(rows)} runs' predictions left the symmetric point's "
            f"(prediction_break_step {at})")


def main(argv=None) -> int:
    """The command (`python -m analysis`, `rw-analysis`). Run as a program (argv None), Ctrl-C, SIGTERM and
    SIGHUP end it with one line and exit 130, 143 or 129 (`rw_sweeps.sweeps.signals`), never a traceback;
    called with an argv (from Python), the caller's signal handling and matplotlib backend stay as
    they are."""
    if argv is not None:
        return _main(argv)
    # the program draws into files only: no window, no display needed. Chosen here, not at import, so that a
    # notebook importing `analysis` keeps its own backend (inline figures)
    matplotlib.use("Agg")
    # the libraries imported so far (pandas, matplotlib, torch, …) live as long as the program: out of every
    # later collection (~0.25 CPU s of a 1,000-run report)
    gc.freeze()
    signals.install()
    try:
        code = _main(argv)
    except KeyboardInterrupt as exc:
        code = signals.stopping(exc)
        print(f"\n{signals.how(code)}: the report is not complete; run the same command again", file=sys.stderr,
              flush=True)
        signals.said()
        return code
    signals.finishing()
    return code


def _main(argv=None) -> int:
    ap, args = parse_args(argv)
    try:
        seal.check()  # the runs' cache is sealed: a key that cannot be used is one line, before anything is written
        rep = build(args.sweeps, args.out, args.x, args.y, args.row, args.col, args.metric, args.tol,
                    args.paper, args.refresh)
    except UsageError as e:
        ap.error(str(e))
    except seal.SealKeyError as e:
        print(f"error: {shown(e)}", file=sys.stderr)
        return 2
    except safefs.PlantedLink as e:  # a folder of the report swapped for a link (the one before is parse_args's)
        print(f"error: --out {shown(args.out)}: {shown(e)}", file=sys.stderr)
        return 2
    if not len(rep.runs):
        print(f"error: no finished runs in {shown(' '.join(map(str, args.sweeps)))} "
              f"({len(rep.skipped)} folders skipped); see {shown(rep.path)}", file=sys.stderr)
        return 2
    if args.wandb:
        x, y, row, col = rep.axes
        log_to_wandb(args.out, rep.runs, rep.figures, args.wandb_mode, config={
            "sweeps": [str(p) for p in args.sweeps], "tol": args.tol, "metric": args.metric,
            "x": x, "y": y, "row": row, "col": col})
    c = counts(rep.runs, rep.skipped)[["runs", "done", "failed", "diverged", "unfinished", "corrupt", "copies"]]
    c = c.drop(columns=["copies"]) if not c["copies"].any() else c
    print(f"{shown(rep.path)}: {sum('file' in f for f in rep.figures)} figures; " + ", ".join(
        f"{k} {v}" for k, v in c.sum().items()))
    for n in rep.notes:  # names from the sweep folders: control characters as escapes, one line each
        print("note:", shown(n), file=sys.stderr)
    return 0


def _reading_table(runs, out) -> list[dict]:
    """The reading search's table (claims.py) as OUT/readings.csv and .md, and for the report."""
    table = claims.reading_table(runs)
    if not len(table):
        return []
    safefs.atomic_write(out / "readings.csv", table.to_csv(index=False))
    cells = claims.display(table)
    caption = (f"The reading search: {int(table['runs'].sum())} runs of "
               f"{', '.join(claims.READING_EXPERIMENTS)}, one row per reading (seeds pooled), "
               "each cell the fraction of the reading's runs for which the claim holds (– : no run "
               "can say), best first by the mean over the claims with data. The claims: "
               f"{claims.legend()}.")
    safefs.atomic_write(out / "readings.md", caption + "\n\n" + claims.to_markdown(cells))
    return [{"df": cells, "caption": caption, "section": "Reading search"}]


def _hold_out(out: Path, sweeps) -> None:
    """Every file of the report is written through a folder's handle, never by path (`safefs.write_with`): a
    report inside a sweep folder (the launch's `wandb_analysis/report`) from the sweep's handle, one folder at
    a time, so a folder on the way swapped for a link at any moment is refused; any other from `out`'s own,
    held (made if missing) from here on. A link at `out` is refused either way (`safefs.PlantedLink`)."""
    for sweep in sweeps:
        if Path(os.path.abspath(sweep)) in out.parents:
            try:
                safefs.hold(sweep, create=False)
            except OSError:
                break  # a link given as the sweep (the user's own choice): the report is held as any other
            safefs.ensure_dir(out)
            return
    safefs.hold(out)


def _axes(asked, runs, notes, family=None):
    """The axes asked for, else the swept keys in order (x, y, row, col) (of one data family's runs)."""
    for flag, key in zip(("--x", "--y", "--row", "--col"), asked):
        if key and key not in runs.columns:
            raise UsageError(f"{flag} {key}: no such key; swept keys: {', '.join(swept_keys(runs)) or 'none'}")
    given = [k for k in asked if k]
    free = [k for k in swept_keys(runs) if k not in given]
    if "init.sigma" in given and "init" in free:
        free.remove("init")   # already on the σ axis as its zero-init column
    picked = []
    for key in asked:
        picked.append(key or (free.pop(0) if free else None))
    if picked[0] is None:       # nothing swept: one cell, on p if the runs have it
        picked[0] = next((k for k in ("data.p", "data.name", "init") if k in runs.columns),
                         "status")
    if free:
        notes.append(f"{family + ': ' if family else ''}also swept, averaged within each cell: "
                     f"{', '.join(free)} (pass --row/--col to split them)")
    return picked


if __name__ == "__main__":
    sys.exit(main())
