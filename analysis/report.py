"""index.html: every figure, each sweep's config, and the count of done / failed / diverged runs
(plus the folders that could not be read). Optionally the same figures in a wandb run."""
from __future__ import annotations

import html
from collections import Counter
from pathlib import Path

import pandas as pd

from .load import STATUSES, config_keys

CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:13px}th{background:#f3f3f3}figure{margin:1.5em 0}
img{max-width:100%;border:1px solid #eee}figcaption{color:#444;font-size:14px}
.note{background:#fff8e0;padding:6px 10px;border-left:4px solid #e0b000}"""


def counts(runs: pd.DataFrame, skipped: list[dict]) -> pd.DataFrame:
    """Per sweep: runs read, done/failed/diverged, and folders skipped as unfinished/corrupt."""
    sweeps = sorted(set(runs.get("sweep", pd.Series(dtype=str)))
                    | {str(Path(s["path"]).parent) for s in skipped})
    rows = []
    for sw in sweeps:
        sub = runs[runs["sweep"] == sw] if len(runs) else runs
        st = Counter(sub["status"]) if len(sub) else Counter()
        sk = Counter(s["status"] for s in skipped if str(Path(s["path"]).parent) == sw)
        rows.append({"sweep": sw, "runs": len(sub), **{s: st.get(s, 0) for s in STATUSES},
                     "other status": sum(v for k, v in st.items() if k not in STATUSES),
                     "unfinished": sk.get("unfinished", 0), "corrupt": sk.get("corrupt", 0),
                     "success": int(sub["success"].sum()) if "success" in sub else 0})
    return pd.DataFrame(rows)


def sweep_config(runs: pd.DataFrame) -> pd.DataFrame:
    """One line per config key: its value if the same in every run, else the values swept."""
    rows = []
    for k in config_keys(runs):
        vals = runs[k].dropna().unique().tolist()
        vals = sorted(vals, key=str)
        shown = ", ".join(map(str, vals[:12])) + (f", … ({len(vals)} values)"
                                                   if len(vals) > 12 else "")
        rows.append({"key": k, "value": shown if vals else "null",
                     "swept": "yes" if len(vals) > 1 else ""})
    return pd.DataFrame(rows)


def write_report(out: Path, runs: pd.DataFrame, skipped: list[dict], figures: list[dict],
                 notes: list[str] = (), title: str = "rw-sweeps analysis") -> Path:
    """`figures`: dicts with `caption`, `section` and either `file` (an image, relative to `out`)
    or `df` (a table), shown in their order, grouped by section."""
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
         f"<style>{CSS}</style></head><body><h1>{_e(title)}</h1>"]
    h += [f"<p class='note'>{_e(n)}</p>" for n in notes]
    h.append("<h2>Runs</h2>" + _table(counts(runs, skipped))
             + "<p>One row per run: <a href='runs.parquet'>runs.parquet</a></p>")
    sections = list(dict.fromkeys(f["section"] for f in figures))
    for sec in sections:
        h.append(f"<h2>{_e(sec)}</h2>")
        for f in (f for f in figures if f["section"] == sec):
            if "df" in f:
                h.append(f"<p>{_e(f['caption'])}</p>" + _table(f["df"]))
                continue
            h.append(f"<figure><img src='{_e(f['file'])}' alt='{_e(f['caption'])}'>"
                     f"<figcaption>{_e(f['caption'])}</figcaption></figure>")
    for sw, sub in (runs.groupby("sweep") if len(runs) else []):
        h.append(f"<h2>Config of {_e(sw)}</h2>" + _table(sweep_config(sub)))
    bad = runs[runs["status"] != "done"] if len(runs) else runs
    if len(bad):
        cols = [c for c in ("path", "status", "error", "steps") if c in bad.columns]
        h.append("<h2>Failed and diverged runs</h2>" + _table(bad[cols]))
    if skipped:
        h.append("<h2>Folders skipped</h2>" + _table(pd.DataFrame(skipped)))
    h.append("</body></html>")
    path = Path(out) / "index.html"
    path.write_text("\n".join(h), encoding="utf-8")
    return path


def log_to_wandb(out: Path, runs: pd.DataFrame, figures: list[dict], mode: str = "offline",
                 config: dict | None = None):
    """Log the report's figures to a wandb run of job_type "analysis" in the sweep's group, so
    they sit beside the training runs; its files go under `out`."""
    import wandb   # optional: only this flag needs it

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
