"""rw-show SWEEP RUN [--file FILE | --to DIR]: one run of a sweep as its run folder holds it.

A run of a large sweep has no folder to `ls` and `cat`: its sweep's store holds it (`rw_sweeps.core.store`).
This prints it as the folder would: by default a short view (its config.yaml, summary.json, how many rows its
history.jsonl holds and the last of them, its Hydra overrides); `--file NAME` prints one file's text exactly as
a run folder holds it (`rw_sweeps.core.results` writes a folder run's files: the same bytes, but for the
summary's `wall_s` and `run_id`, which a folder run of the same config in another sweep has its own of);
`--to DIR` writes the run as a run folder (config.yaml, history.jsonl, snapshots.jsonl, .hydra/overrides.yaml,
then summary.json, which marks a run finished) into a new folder DIR. A run folder is shown the same way, its
files as they are.

RUN is the run's name: its folder relative to the sweep folder (`17`, `0/run`), as `rw-status` names it. A
stored run is read only through the store's verified readers (`store.index`, its `record`, `store.body_rows`):
a shard that does not verify is refused, with its file and why. Every error is one line, exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rw_sweeps.core import contract, layout, readers, results, safefs, store
from rw_sweeps.core.console import prog, shown
from rw_sweeps.core.contract import CONFIG, HISTORY, SNAPSHOTS, SUMMARY
from rw_sweeps.core.store import shard

from .hydra_job import to_yaml

OVERRIDES = ".hydra/overrides.yaml"  # the Hydra job's overrides, in its run folder
HYDRA = ".hydra/hydra.yaml"  # the Hydra job's config: a stored run's job's, kept in its head's metadata
OVERRIDES_CAP = 1024 * 1024  # bytes of a job's overrides.yaml (a list of `key=value` lines)
FILES = {"config.yaml": CONFIG, "summary.json": SUMMARY, "history.jsonl": HISTORY, "snapshots.jsonl": SNAPSHOTS,
         "overrides.yaml": OVERRIDES, "hydra.yaml": HYDRA}  # --file's names → the file's place in a run folder
CAPS = {CONFIG: contract.CAPS[CONFIG], SUMMARY: contract.CAPS[SUMMARY], HISTORY: contract.FILE_CAPS[HISTORY],
        SNAPSHOTS: contract.FILE_CAPS[SNAPSHOTS], OVERRIDES: OVERRIDES_CAP,
        HYDRA: OVERRIDES_CAP}  # a run folder's files, read within these
WRITE_ORDER = (CONFIG, HISTORY, SNAPSHOTS, OVERRIDES, HYDRA, SUMMARY)  # the summary last: it marks a run finished
NAMES_SHOWN = 5  # run names a "no such run" line gives


class Refusal(Exception):
    """What rw-show cannot show, as one line."""


# ------------------------------------------------------------------------------------------ a stored run's text
def config_text(config: dict) -> str:
    """config.yaml's text, as `results.write_config` writes it."""
    return results.config_text(config)


def summary_text(summary: dict) -> str:
    """summary.json's text, as `results.write_summary` writes it."""
    return json.dumps(results.clean(summary), indent=1, allow_nan=False) + "\n"


def rows_text(rows: list[dict]) -> str:
    """history.jsonl's or snapshots.jsonl's text, as `results.write_run` writes it."""
    return results.jsonl(rows)


def overrides_text(overrides: list[str]) -> str:
    """.hydra/overrides.yaml's text, as the launcher writes a job's (Hydra's own YAML)."""
    return to_yaml(list(overrides))


def stored_overrides(idx: store.Index, name: str) -> list[str]:
    """The stored run's overrides, from its head's `_overrides` (verified with the head, as `Index.record`
    reads its config and summary)."""
    sid, row, _ = idx.runs[name]
    text = shard.read_head(idx.heads[sid][0], columns=["_overrides"]).slice(row, 1).column("_overrides")[0].as_py()
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(o, str) for o in value):
        raise Refusal(f"store/{sid}{shard.HEAD}: run {name}'s overrides are not a list of strings")
    return value


def stored_texts(sweep: Path, name: str, which=WRITE_ORDER) -> dict[str, str]:
    """The texts of the files `which` that the stored run's folder would hold, read from its verified record
    (a body is read only when its history or snapshots are asked for)."""
    idx = store.index(sweep)
    config, summary = idx.record(name)
    out = {}
    if HISTORY in which or SNAPSHOTS in which:
        try:
            history, snapshots = store.body_rows(sweep, [name])[name]
        except store.Refused as exc:
            raise Refusal(f"store/{exc.name} is refused: {exc.why}") from None
        except readers.Broken as exc:
            raise Refusal(exc.why) from None
        out[HISTORY], out[SNAPSHOTS] = rows_text(history), rows_text(snapshots)
    if CONFIG in which:
        out[CONFIG] = config_text(config)
    if SUMMARY in which:
        out[SUMMARY] = summary_text(summary)
    if OVERRIDES in which:
        out[OVERRIDES] = overrides_text(stored_overrides(idx, name))
    hydra = idx.heads[idx.runs[name][0]][1].get("hydra")
    if HYDRA in which and isinstance(hydra, str):  # its job's (none with `lean`)
        out[HYDRA] = hydra
    return {f: out[f] for f in WRITE_ORDER if f in which}


def folder_texts(run_dir: Path, which=WRITE_ORDER) -> dict[str, bytes]:
    """The files `which` that a run folder holds, each as its bytes (a regular file within its cap, never
    through a link); a file it lacks is left out."""
    out = {}
    for f in which:
        try:
            out[f] = readers.read_bytes(run_dir / f, CAPS[f], f)
        except FileNotFoundError:
            continue
        except readers.Broken as exc:
            raise Refusal(exc.why) from None
    return out


# ------------------------------------------------------------------------------------------ which run
def stored(sweep: Path, name: str) -> bool:
    """Is `name` read from the sweep's store? When the store holds it and no run folder does (a folder that
    holds none of a run's files, `layout.RUN_FILES`, is no run's)."""
    return store.present(sweep) and name in store.index(sweep).runs and not layout.holds_run(sweep / name)


def find(sweep: Path, name: str) -> str:
    """Where the run is: `store/<shard>.runs.parquet` or `folder`; else Refusal, one line."""
    if sweep.is_symlink():
        raise Refusal(f"{sweep} is a symbolic link; not followed")
    if not sweep.is_dir():
        raise Refusal(f"no such sweep: {sweep}")
    if not layout.valid_name(name):
        raise Refusal(f"{name!r} is no run's name (its folder relative to the sweep folder, e.g. 17 or 0/run)")
    why = layout.problem(sweep, name)
    if why is not None:
        raise Refusal(f"run {name} of {sweep}: {why}")
    if stored(sweep, name):
        return f"{store.STORE}/{store.index(sweep).runs[name][0]}{shard.HEAD}"
    if (sweep / name).is_dir():
        return "folder"
    raise Refusal(_no_such_run(sweep, name))


def _no_such_run(sweep: Path, name: str) -> str:
    names = layout.run_folders(sweep)
    first = ", ".join(names[:NAMES_SHOWN]) + (", …" if len(names) > NAMES_SHOWN else "")
    line = f"no run {name} in {sweep}: it has {len(names)} run{'' if len(names) == 1 else 's'}" + (
        f" ({first})" if names else "")
    refused = store.index(sweep).refused if store.present(sweep) else {}
    if refused:
        file, why = next(iter(sorted(refused.items())))
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        line += f"; its store refused {len(refused)} file{'' if len(refused) == 1 else 's'} that may hold it: " \
                f"{store.STORE}/{file}: {why}{more}"
    return line


def texts(sweep: Path, name: str, which=WRITE_ORDER) -> tuple[str, dict[str, bytes]]:
    """(where the run is, its files `which` as a run folder holds them, each as bytes)."""
    where = find(sweep, name)
    if where == "folder":
        return where, folder_texts(sweep / name, which)
    return where, {f: t.encode() for f, t in stored_texts(sweep, name, which).items()}


def verdict(sweep: Path, name: str, where: str) -> contract.Verdict:
    """The contract's verdict on the run (a stored run's record was judged before it was sealed)."""
    if where == "folder":
        return contract.judge(sweep / name)
    return store.index(sweep).verdict(name)


# ------------------------------------------------------------------------------------------ what is printed
def short_view(sweep: Path, name: str) -> str:
    """The default view: the run's state and where it is, its config, summary, history's length and last row,
    and overrides; every control character shown as an escape (`console.shown`)."""
    where, files = texts(sweep, name)
    v = verdict(sweep, name, where)
    place = "a run folder" if where == "folder" else f"stored in {where}"
    lines = [f"run {name} of {sweep}: {v.state}" + (f" ({v.why})" if v.why and v.state != "done" else "")
             + f"; {place}"]

    for f in (CONFIG, SUMMARY, HISTORY, OVERRIDES):
        if f not in files:
            lines.append(f"== {f}: none")
        elif f == HISTORY:
            rows = [ln for ln in files[f].split(b"\n") if ln.strip()]
            lines.append(f"== {f}: {len(rows)} row{'' if len(rows) == 1 else 's'}" + (", the last:" if rows else ""))
            lines.extend(r.decode("utf-8", "replace") for r in rows[-1:])
        else:
            lines.append(f"== {f}")
            lines.extend(files[f].decode("utf-8", "replace").splitlines())
    return "\n".join(shown(ln) for ln in lines) + "\n"


def write_folder(sweep: Path, name: str, to: Path) -> Path:
    """The run written as a run folder into `to`, a folder that does not exist yet or is empty: its files in
    `WRITE_ORDER` (the summary last), each through the atomic writer (`safefs`)."""
    if to.is_symlink() or (to.exists() and not to.is_dir()):
        raise Refusal(f"--to {to}: not a folder")
    if to.is_dir() and any(to.iterdir()):
        raise Refusal(f"--to {to}: it exists and is not empty; --to writes a new folder")
    _, files = texts(sweep, name)
    safefs.ensure_dir(to)
    for f, body in files.items():
        if "/" in f:
            safefs.ensure_dir(to / Path(f).parent)
        safefs.atomic_write(to / f, body)
    return to


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("rw_sweeps.sweeps.show", "rw-show"), description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, metavar="SWEEP", help="the sweep folder (hydra.sweep.dir)")
    ap.add_argument("run", metavar="RUN", help="the run's name: its folder relative to the sweep (17, 0/run)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--file", choices=list(FILES), help="print this file's text exactly as a run folder holds it")
    how.add_argument("--to", type=Path, metavar="DIR", help="write the run as a run folder into DIR (new, or empty)")
    args = ap.parse_args(argv)
    try:
        if args.file:
            f = FILES[args.file]
            _, files = texts(args.sweep, args.run, (f,))
            if f not in files:
                raise Refusal(f"run {args.run} of {args.sweep} has no {f}")
            sys.stdout.buffer.write(files[f])
        elif args.to:
            to = write_folder(args.sweep, args.run, args.to)
            print(shown(f"run {args.run} of {args.sweep} written to {to}"))
        else:
            sys.stdout.write(short_view(args.sweep, args.run))
    except Refusal as exc:
        print(shown(f"{ap.prog}: {exc}"), file=sys.stderr)
        return 2
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
