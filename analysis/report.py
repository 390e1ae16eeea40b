"""index.html: every figure, each sweep's config, and the count of done / failed / diverged runs
(plus the folders that could not be read). Optionally the same figures in a wandb run."""
from __future__ import annotations

import html
import shlex
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from rw_sweeps.core import safefs, store

from .load import OPTION_COLUMNS, STATUSES, config_keys, has_key
from .phase import ZERO, swept_keys, zero_init

CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:13px}th{background:#f3f3f3}figure{margin:1.5em 0}
img{max-width:100%;border:1px solid #eee}figcaption{color:#444;font-size:14px}
.note{background:#fff8e0;padding:6px 10px;border-left:4px solid #e0b000}"""


def counts(runs: pd.DataFrame, skipped: list[dict]) -> pd.DataFrame:
    """Per sweep: runs read, done/failed/diverged, and folders skipped as unfinished/corrupt or as copies of a
    run counted already."""
    known = set(runs.get("sweep", pd.Series(dtype=str)))
    of = [_sweep_of(s["path"], known) for s in skipped]
    sweeps = sorted(known | set(of))
    rows = []
    for sw in sweeps:
        sub = runs[runs["sweep"] == sw] if len(runs) else runs
        st = Counter(sub["status"]) if len(sub) else Counter()
        sk = Counter(s["status"] for s, at in zip(skipped, of) if at == sw)
        rows.append({"sweep": sw, "runs": len(sub), **{s: st.get(s, 0) for s in STATUSES},
                     "other status": sum(v for k, v in st.items() if k not in STATUSES),
                     "unfinished": sk.get("unfinished", 0), "corrupt": sk.get("corrupt", 0),
                     "copies": sk.get("copy", 0),
                     "success": int(sub["success"].sum()) if "success" in sub else 0})
    return pd.DataFrame(rows)


def _sweep_of(path: str, sweeps: set) -> str:
    """The sweep a skipped entry belongs to: the loaded sweep folder above it (a run at `0/run`, a refused
    file of the sweep's store at `store/<shard>`), else the folder it is in."""
    for above in Path(path).parents:
        if str(above) in sweeps:
            return str(above)
    parent = Path(path).parent
    return str(parent.parent if parent.name == store.STORE else parent)


def sweep_config(runs: pd.DataFrame) -> pd.DataFrame:
    """One line per config key of the options the sweep's runs used (a key no run's option has is left out):
    its value if the same in every run that has it, else the values; `of`, the options that have it where
    not every run's does (`optim=adam` for `optim.beta1` in a gd and adam sweep); and whether it was swept
    (an axis of the grid, or the seed) or derived (it varies, but follows the swept keys, as
    `model.normalize` follows `init`)."""
    swept = set(swept_keys(runs, sigma_axis=False)) | {"seed"}
    rows = []
    for k in config_keys(runs):
        own = has_key(runs, k)
        vals = runs.loc[own, k].tolist()
        if not vals:
            continue
        vals = sorted(dict.fromkeys(_yaml(v) for v in vals), key=str)
        shown = ", ".join(vals[:12]) + (f", … ({len(vals)} values)" if len(vals) > 12 else "")
        group = k.partition(".")[0]
        option = OPTION_COLUMNS.get(group) if "." in k else None
        of = ("" if own.all() or option not in runs else
              ", ".join(f"{group}={o}" for o in dict.fromkeys(runs.loc[own, option].dropna())))
        rows.append({"key": k, "value": shown, "of": of,
                     "role": ("swept" if k in swept else "derived") if len(vals) > 1 else ""})
    return pd.DataFrame(rows, columns=["key", "value", "of", "role"])


def _yaml(v) -> str:
    """A config value as config.yaml spells it (null, true, 0.5, [0, 1])."""
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return "null"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    return str(v.item() if isinstance(v, np.generic) else v)


RUN_COLUMNS = ("status", "success", "test_acc", "opt_acc", "success_step", "symmetry_break_step",
               "parent_attention", "test_kl", "test_loss", "steps", "wall_s")
MAX_RUN_ROWS = 2000  # rows in the page's per-run table; every run is in runs.parquet


def run_table(runs: pd.DataFrame, out: Path) -> tuple[str, int]:
    """The per-run table as HTML (a link to each run's folder, or for a stored run the `rw-show` command that
    prints it, the swept keys, the seed, the headline
    fields), sortable by any column in the browser, and how many runs it leaves out."""
    keys = [k for k in swept_keys(runs) if k != "seed"] + (["seed"] if "seed" in runs else [])
    cols = [c for c in dict.fromkeys([*keys, *RUN_COLUMNS]) if c in runs.columns]
    shown = runs.head(MAX_RUN_ROWS)
    if "init.sigma" in cols:   # σ of zero init as every figure shows it
        shown = shown.assign(**{"init.sigma": shown["init.sigma"].astype(object).where(~zero_init(shown), ZERO)})
    head = "<th>run</th>" + "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = []
    for path, row in zip(shown["path"], shown[cols].itertuples(index=False)):
        href = Path(os.path.relpath(path, Path(out).resolve())).as_posix()
        cells = "".join(f"<td>{_e(_num(v))}</td>" for v in row)
        # a stored run has no folder to link to: its name, with the command that prints it as a folder would
        sweep, run = os.path.split(path)
        name = (f"<a href='{_e(href)}/'>{_e(run)}</a>" if os.path.isdir(path)
                else f"<span title='{_e(f'rw-show {shlex.quote(sweep)} {shlex.quote(run)}')}'>{_e(run)}</span>")
        body.append(f"<tr><td>{name}</td>{cells}</tr>")
    html_ = (f"<table class='sortable' id='runs'><thead><tr>{head}</tr></thead>"
             f"<tbody>{''.join(body)}</tbody></table>")
    return html_, len(runs) - len(shown)


def negative_loss_note(runs: pd.DataFrame) -> str:
    """Why the table's test_loss may be below 0, where any run's is: eq. 2.1's loss is −log(f_y + ε) of a raw score
    f_y = (V·X·S)_y, not a probability, which exceeds 1 − ε once V has grown; a softmax's cross-entropy cannot."""
    loss = pd.to_numeric(runs["test_loss"], errors="coerce") if "test_loss" in runs else pd.Series(dtype=float)
    n = int((loss < 0).sum())
    if not n:
        return ""
    return (f" {n} run(s) have a negative test_loss (lowest {loss.min():.3g}): eq. 2.1's loss (and model=gpt's with "
            "model.readout=linear) is −log(f_y + ε) of the raw score f_y = (V·X·S)_y, which is not a probability "
            "and exceeds 1 − ε once V has grown, so the loss goes below 0; a softmax readout's cross-entropy "
            "cannot.")


def _num(v):
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return ""
    return f"{v:.4g}" if isinstance(v, float) else v


# Click a column's head to sort by it (numbers as numbers, blanks last); again to reverse.
SORT_JS = """document.querySelectorAll('table.sortable th').forEach((th,i)=>{th.style.cursor='pointer';
th.title='sort';th.onclick=()=>{const t=th.closest('table'),b=t.tBodies[0],up=th.dataset.dir!=='up';
th.dataset.dir=up?'up':'down';const v=r=>r.cells[i].textContent,n=x=>x===''?NaN:Number(x);
[...b.rows].sort((a,c)=>{const x=v(a),y=v(c),nx=n(x),ny=n(y);let d;
if(!isNaN(nx)&&!isNaN(ny))d=nx-ny;else if(x==='')d=1;else if(y==='')d=-1;else d=x.localeCompare(y);
return up?d:-d}).forEach(r=>b.appendChild(r))}});"""


def write_report(out: Path, runs: pd.DataFrame, skipped: list[dict], figures: list[dict],
                 notes: list[str] = (), title: str = "rw-sweeps analysis") -> Path:
    """`figures`: dicts with `caption`, `section` and either `file` (an image, relative to `out`)
    or `df` (a table), shown in their order, grouped by section."""
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
         f"<style>{CSS}</style></head><body><h1>{_e(title)}</h1>"]
    h += [f"<p class='note'>{_e(n)}</p>" for n in notes]
    h.append("<h2>Runs</h2>" + _table(counts(runs, skipped)))
    sections = list(dict.fromkeys(f["section"] for f in figures))
    for sec in sections:
        h.append(f"<h2>{_e(sec)}</h2>")
        for f in (f for f in figures if f["section"] == sec):
            if "df" in f:
                h.append(f"<p>{_e(f['caption'])}</p>" + _table(f["df"]))
                continue
            h.append(f"<figure><img src='{_e(f['file'])}' alt='{_e(f['caption'])}'>"
                     f"<figcaption>{_e(f['caption'])}</figcaption></figure>")
    if len(runs):
        table, left = run_table(runs, out)
        h.append("<h2>Every run</h2><p>One row per run, linked to its folder; click a column to sort. "
                 + (f"The first {MAX_RUN_ROWS} runs; all {len(runs)} are in " if left else "Also as ")
                 + "<a href='runs.parquet'>runs.parquet</a> (<code>pandas.read_parquet</code>)."
                 + _e(negative_loss_note(runs)) + "</p>" + table)
    for sw, sub in (runs.groupby("sweep") if len(runs) else []):
        h.append(f"<h2>Config of {_e(sw)}</h2><p>The keys of the options its runs used. <b>swept</b>: a grid "
                 "axis (or the seed); <b>derived</b>: varies, but follows the swept keys; <b>of</b>: the options that "
                 "have the key, where not every run's option does.</p>"
                 + _table(sweep_config(sub)))
    bad = runs[runs["status"] != "done"] if len(runs) else runs
    if len(bad):
        cols = [c for c in ("path", "status", "error", "steps") if c in bad.columns]
        h.append("<h2>Failed and diverged runs</h2>" + _table(bad[cols]))
    if skipped:
        h.append("<h2>Folders skipped</h2>" + _table(pd.DataFrame(skipped)))
    h.append(f"<script>{SORT_JS}</script></body></html>")
    path = Path(out) / "index.html"
    safefs.atomic_write(path, "\n".join(h))  # through the report folder's handle (`analysis.__main__.build`)
    return path


def log_to_wandb(out: Path, runs: pd.DataFrame, figures: list[dict], mode: str = "offline",
                 config: dict | None = None):
    """Log the report's figures to a wandb run of job_type "analysis" in the sweep's group, so
    they sit beside the training runs; its files go under `out`."""
    import wandb   # optional: only this flag needs it

    safefs.owned_dirs(Path(out), "wandb")  # wandb writes there by path: a link at its place refused, not followed

    def most_common(col, default):
        s = runs[col].dropna() if col in runs.columns else pd.Series(dtype=object)
        return s.mode().iloc[0] if len(s) else default

    run = wandb.init(project=most_common("wandb.project", "rw-sweeps"),
                     group=most_common("wandb.group", None), job_type="analysis", mode=mode,
                     dir=str(out), config=config or {})
    run.log({Path(f["file"]).stem: wandb.Image(str(Path(out) / f["file"]), caption=f["caption"])
             for f in figures if "file" in f})
    st = Counter(runs["status"]) if len(runs) else Counter()
    run.summary.update({f"runs_{s}": st.get(s, 0) for s in STATUSES})
    run.finish()
    return run


def _table(df: pd.DataFrame) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v):
    return "" if v is None or (isinstance(v, float) and v != v) else v


def _e(v) -> str:
    return html.escape(str(v), quote=True)
