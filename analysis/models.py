"""The figures of model=gpt sweeps: learning curves against the data family's two baselines, Edelman et
al.'s three in-context strategies, and the mean attention maps per layer and head. Each is (name, caption,
draw) for the report, drawn only where the sweep has such runs (a `unigram_loss` column)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .load import load_history, load_snapshots
from .phase import swept_keys

MAX_PANELS = 12


def model_figures(runs: pd.DataFrame, notes: list[str]) -> list[tuple]:
    """(name, caption, draw) of every model=gpt figure this sweep can draw."""
    if "unigram_loss" not in runs.columns or runs["unigram_loss"].isna().all():
        return []
    sub = runs[runs["unigram_loss"].notna() & (runs["status"] == "done")]
    keys = [k for k in swept_keys(sub) if k != "seed"]
    settings = sub.drop_duplicates(keys) if keys else sub.head(1)
    if len(settings) > MAX_PANELS:
        notes.append(f"model figures: the first {MAX_PANELS} of {len(settings)} settings drawn")
        settings = settings.head(MAX_PANELS)
    out = [("loss_curves", "test loss over training (mean over seeds, min–max band) against the Bayes loss "
            "(opt_loss, dashed) and the unigram baseline (unigram_loss, dotted), one panel per setting",
            lambda: _loss_curves(sub, settings, keys))]
    if "kl_bigram" in sub.columns and sub["data.name"].eq("icl_markov").any():
        out.append(("strategy_kl", "KL(strategy ‖ model) over training for the uniform, in-context unigram "
                    "and in-context bigram strategies (Edelman et al.'s three curves), one panel per setting",
                    lambda: _strategy_kl(sub, settings, keys)))
    out.append(("attention_maps", "mean attention of the test set at the last step, per layer (rows) and "
                "head, for the first setting of the sweep (query position down, key across)",
                lambda: _attention_maps(settings.iloc[0])))
    return out


def _title(run: pd.Series, keys: list[str]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={run[k]}" for k in keys) or str(run.get("model.name", ""))


def _same(hist: pd.DataFrame, run: pd.Series, keys: list[str]) -> pd.DataFrame:
    mask = np.ones(len(hist), bool)
    for k in keys:   # a key the setting's option lacks (<NA>) matches the runs that lack it too
        same = hist[k].isna() if pd.isna(run[k]) else (hist[k] == run[k]).fillna(False)
        mask &= same.to_numpy(dtype=bool)
    return hist[mask]


def _grid(n: int):
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    return fig, axes.flat


def _loss_curves(sub, settings, keys):
    hist = load_history(sub, keys)
    fig, axes = _grid(len(settings))
    for ax, (_, run) in zip(axes, settings.iterrows()):
        h = _same(hist, run, keys) if len(hist) else hist
        if not len(h):
            continue
        g = h.groupby("step")
        ax.plot(g["test_loss"].mean(), lw=1.5, label="test_loss")
        ax.fill_between(g["test_loss"].min().index, g["test_loss"].min(), g["test_loss"].max(), alpha=0.25)
        ax.axhline(h["opt_loss"].mean(), color="k", ls="--", lw=1, label="opt_loss")
        ax.axhline(h["unigram_loss"].mean(), color="grey", ls=":", lw=1.5, label="unigram_loss")
        ax.set_title(_title(run, keys), fontsize=8)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _strategy_kl(sub, settings, keys):
    hist = load_history(sub, keys)
    fig, axes = _grid(len(settings))
    for ax, (_, run) in zip(axes, settings.iterrows()):
        h = _same(hist, run, keys) if len(hist) else hist
        for col, style in (("kl_uniform", ":"), ("kl_unigram", "--"), ("kl_bigram", "-")):
            if len(h) and col in h:
                ax.plot(h.groupby("step")[col].mean(), ls=style, label=col.replace("kl_", ""))
        ax.set_yscale("log")
        ax.set_title(_title(run, keys), fontsize=8)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _attention_maps(run: pd.Series):
    snaps = load_snapshots([run["path"]])
    last = snaps.sort_values("step").iloc[-1] if len(snaps) else None
    maps = last["maps"] if last is not None else None
    if maps is None or (isinstance(maps, float) and maps != maps):  # the run kept only each layer's read row
        rows = [np.asarray(a)[:, None, :] for a in last["attention"]] if last is not None else []
    else:
        rows = [np.asarray(m) for m in maps]  # per layer (H, Tq, T)
    L = len(rows)
    H = max((m.shape[0] for m in rows), default=1)
    fig, axes = plt.subplots(max(L, 1), H, figsize=(3.2 * H, 2.8 * max(L, 1)), squeeze=False)
    for l, m in enumerate(rows):
        for h in range(m.shape[0]):
            ax = axes[l][h]
            ax.imshow(m[h], cmap="viridis", aspect="auto", vmin=0)
            ax.set_title(f"layer {l + 1}, head {h + 1}", fontsize=8)
            ax.set_xlabel("key")
            ax.set_ylabel("query")
    fig.tight_layout()
    return fig
