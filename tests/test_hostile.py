"""Hostile run folders, generated: every damage a stranger can plant in one contract file of a finished run.

One real finished sweep is made per module (two runs: p = 0.5 and p = 1); each generated case copies it, damages
one file of one run (tests/_hostile.py: truncated at any byte, emptied, NUL-filled, nested too deep, a 2 GiB sparse
file, a non-finite number, a 30-digit integer, a value of the wrong type, a link to the other run's file or to
/dev/zero, a FIFO, a folder, the other run's file, and for config.yaml an alias bomb and a code-running tag), and
checks that

(a) `contract.judge` returns within 10 s (in a thread: a FIFO must not block it) a Verdict that is not `done`
    unless the damage left the file's content as the contract reads it, with a one-line `why`;
(b) judging a 2 GiB sparse file allocates less than 100 MB;
(c) analysis agrees: `load_runs` has the run as a row exactly when the judge says done (or failed/diverged),
    and lists it skipped with the judge's state otherwise; the other run stays a done row;
(d) no tag is obeyed: the marker a `!!python/object/apply` tag would create is never created.

A launcher-level test then plants four damages in a copy of a sweep and relaunches it once.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from analysis.load import load_runs
from rw_sweeps.core import contract

from . import _hostile as H
from .conftest import launch

S = ["data.n_train=64", "data.n_test=64", "model.M=200", "optim.steps=5", "wandb.mode=disabled"]
JUDGE_S = 10            # a hang guard, not a speed test
MEMORY_MB = 100


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hostile") / "S"
    r = launch("-m", "data.p=0.5,1", *S, f"hydra.sweep.dir={d}")
    assert r.returncode == 0, r.stderr
    for n in "01":
        assert contract.judge(d / n).state == "done"
    return d


def _judged(run: Path, measure: bool):
    """The verdict on `run`, within JUDGE_S, and the memory judging took (traced peak, growth of the peak RSS)."""
    if not measure:
        return H.within(JUDGE_S, contract.judge, run), 0.0, 0.0
    rss = H.maxrss_mb()
    tracemalloc.start()
    try:
        verdict = H.within(JUDGE_S, contract.judge, run)
        peak = tracemalloc.get_traced_memory()[1] / (1 << 20)
    finally:
        tracemalloc.stop()
    return verdict, peak, H.maxrss_mb() - rss


def check_damage(sweep: Path, name: str, kind: str, arg: int, which: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        s = H.copy_sweep(sweep, tmp / "S")
        run, other = s / which, s / ("1" if which == "0" else "0")
        marker = tmp / "pwned"
        same, what = H.apply(run, name, kind, arg, other, marker)
        case = f"run {which}'s {what}"

        # (a) a verdict, in time, not done for a damaged run, with a one-line why
        verdict, traced, rss = _judged(run, measure=kind == "huge")
        assert isinstance(verdict, contract.Verdict) and verdict.state in H.STATES, case
        if same:
            assert verdict.state == "done", f"{case} leaves the content as it was, yet: {verdict.why}"
        else:
            assert verdict.state != "done", f"{case} is judged done"
            assert isinstance(verdict.why, str) and verdict.why.strip(), case
            assert "\n" not in verdict.why and len(verdict.why) <= 400, f"{case}: why={verdict.why!r}"
        # (b) bounded memory
        assert traced < MEMORY_MB, f"{case}: judging it allocated {traced:.0f} MB"
        assert rss < MEMORY_MB, f"{case}: judging it grew the peak RSS by {rss:.0f} MB"

        # (c) analysis agrees with the judge, run by run
        df = H.within(60, load_runs, s, cache=False, progress=False)
        rows = dict(zip(df["run"], df["status"])) if len(df) else {}
        skipped = {Path(x["path"]).name: x for x in df.attrs["skipped"]}
        if verdict.state in contract.STATUSES:
            assert rows.get(which) == verdict.state and which not in skipped, (case, rows, skipped)
        else:
            assert which not in rows, f"{case}: judged {verdict.state} ({verdict.why}), yet a row of analysis"
            assert skipped[which]["status"] == verdict.state, (case, verdict, skipped[which])
            assert "\n" not in skipped[which]["reason"], skipped[which]
        assert rows.get(other.name) == "done" and contract.judge(other).state == "done", case

        # (d) nothing planted is obeyed
        assert not marker.exists(), f"{case}: a tag ran code"


SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.e2e
@pytest.mark.parametrize("name", H.FILES)
@settings(max_examples=25, **SETTINGS)
@given(data=st.data())
def test_a_run_folder_with_a_file_cut_at_any_byte_is_done_only_if_its_content_is_unchanged(sweep, name, data):
    size = (sweep / "0" / name).stat().st_size
    at = data.draw(st.one_of(st.integers(0, size - 1), st.sampled_from([0, 1, size - 1, size - 2])), label="at")
    check_damage(sweep, name, "truncate", at, data.draw(st.sampled_from("01"), label="run"))


@pytest.mark.e2e
@pytest.mark.parametrize("name,kind", [(n, k) for n in H.FILES for k in H.kinds(n)])
@settings(max_examples=8, **SETTINGS)
@given(data=st.data())
def test_a_damaged_run_folder_is_never_done_and_analysis_agrees(sweep, name, kind, data):
    arg = data.draw(st.integers(0, H.variants(name, kind) - 1), label="variant")
    check_damage(sweep, name, kind, arg, data.draw(st.sampled_from("01"), label="run"))


@pytest.mark.e2e
def test_a_tag_that_would_run_code_is_never_obeyed_by_the_judge_analysis_or_a_relaunch(sweep, tmp_path):
    s = H.copy_sweep(sweep, tmp_path / "S")
    marker = tmp_path / "pwned"
    text = (s / "0" / "config.yaml").read_text()
    (s / "0" / "config.yaml").write_text(H.set_config_value(text, "seed", H.tag_payload(marker)))
    (s / "1" / "config.yaml").write_text(H.tag_payload(marker) + "\n")
    for n in "01":
        v = contract.judge(s / n)
        assert v.state == "corrupt" and "uses a YAML tag" in v.why
    df = load_runs(s, cache=False, progress=False)
    assert len(df) == 0 and sorted(x["status"] for x in df.attrs["skipped"]) == ["corrupt", "corrupt"]
    r = launch("-m", "data.p=0.5,1", *S, f"hydra.sweep.dir={s}", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not marker.exists()
    for n in "01":   # the folders, whose config was no run's, are trained over
        assert contract.judge(s / n).state == "done"
        assert "!!" not in (s / n / "config.yaml").read_text()


# ------------------------------------------------------------------------------ named reproductions
@pytest.mark.e2e
@pytest.mark.parametrize("kept", ["", "seed: 0\n"], ids=["emptied", "cut-after-its-first-line"])
def test_a_config_yaml_that_lost_its_keys_is_not_done_nor_shown_at_the_schema_defaults(sweep, tmp_path, kept):
    """A config.yaml emptied (or cut) reads at the schema's defaults: p = 0.5, M = 1000, 50 steps. The run of
    p = 1, M = 200, 5 steps must not be done under that config, nor a row of analysis that says so."""
    s = H.copy_sweep(sweep, tmp_path / "S")
    (s / "1" / "config.yaml").write_text(kept)
    v = contract.judge(s / "1")
    df = load_runs(s, cache=False, progress=False)
    row = df[df["run"] == "1"]
    assert row.empty or (row["data.p"].tolist(), row["model.M"].tolist(), row["optim.steps"].tolist()) == \
        ([1.0], [200], [5]), row[["data.p", "model.M", "optim.steps"]].to_dict("records")
    assert v.state != "done", f"a config.yaml holding {kept!r} is judged done"


def test_a_30_digit_integer_in_a_json_file_is_refused_as_outside_int64(tmp_path):
    """readers' rule: integers within int64. orjson reads an integer past 2**64 as a float, so the rule must not
    rest on `bounded` seeing an int."""
    from rw_sweeps.core import readers

    with pytest.raises(readers.Broken, match="outside int64"):
        readers.json_value(b'{"steps": 18446744073709551616}', tmp_path / "summary.json")   # 2**64: orjson says float
    with pytest.raises(readers.Broken, match="outside int64"):
        readers.json_value(f'{{"wall_s": {H.HUGE_INT}}}'.encode(), tmp_path / "summary.json")


@pytest.mark.parametrize("number", ["9223372036854775808", "-9223372036854775809", "18446744073709551615",
                                    "-18446744073709551616", "99999999999999999999999"])
@pytest.mark.parametrize("where", ["{{\"steps\": {}}}", "{{\"x\": [1, {}, 2], \"step\": 5}}", "{}"])
def test_every_integer_just_outside_int64_is_refused_however_few_brackets_hold_it(tmp_path, number, where):
    """A text of at most 64 brackets is not walked value by value (orjson's numbers are finite): each integer of 19
    digits or more is checked exactly instead. 19 digits is where int64 ends on both sides; the rule once looked
    at 20 and read −2**63 − 1 as a float, so a history row holding it was judged done."""
    from rw_sweeps.core import readers

    with pytest.raises(readers.Broken, match="outside int64"):
        readers.json_value(where.format(number).encode(), tmp_path / "history.jsonl")
    for inside in ("9223372036854775807", "-9223372036854775808", "1000000000000000000"):  # int64's ends: kept
        assert readers.json_value(where.format(inside).encode(), tmp_path / "history.jsonl") is not None
    deep = ("[" * 65 + "1" + "]" * 65).encode()  # more than 64 brackets: walked, and 65 levels is too deep
    with pytest.raises(readers.Broken, match="nests deeper than 64"):
        readers.json_value(deep, tmp_path / "history.jsonl")


@settings(max_examples=300, **SETTINGS)
@given(parts=st.lists(st.one_of(st.binary(max_size=9), st.just(b"\n"), st.just(b"\n\n")), max_size=12),
       line_cap=st.integers(1, 8), cap=st.integers(0, 40), block=st.sampled_from([1, 2, 3, 5, 1 << 20]))
@example(parts=[b"abc"], line_cap=2, cap=3, block=1)           # the overlong line ends at the file's cap
@example(parts=[b"ab\n", b"cdef"], line_cap=3, cap=7, block=2)  # … and past it
def test_the_digest_of_a_file_of_lines_stops_where_its_reader_stops_and_says_what_it_says(
        tmp_path, parts, line_cap, cap, block):
    """analysis' cache key (`readers.digest` with a line cap) hashes a file of lines as far as `readers.lines`
    reads it: the same Broken, word for word, at the same line (the file's cap where `lines` meets it first),
    else the digest of every byte; at any block boundary. A 2 GiB sparse snapshots.jsonl was hashed whole
    (10 s of analysis per run) where the judge stops after 32 MiB."""
    import hashlib

    from rw_sweeps.core import readers

    f = tmp_path / "history.jsonl"
    f.write_bytes(b"".join(parts))
    try:
        for _ in readers.lines(f, line_cap, cap):   # read to its end, or to its refusal
            pass
        said = None
    except readers.Broken as e:
        said = e.why
    try:
        got, why = readers.digest(f, cap, line_cap=line_cap, block=block), None
    except readers.Broken as e:
        got, why = None, e.why
    assert why == said, (why, said)
    if said is None:
        assert got == hashlib.blake2b(f.read_bytes(), digest_size=16).digest()


@pytest.mark.e2e
@pytest.mark.parametrize("summary", ["failed", "absent", "done"])
def test_a_file_the_cache_key_cannot_hash_leaves_the_verdict_to_the_judge(sweep, tmp_path, summary):
    """A 2 GiB sparse snapshots.jsonl (its first line over its cap) in a failed run, whose snapshots the judge does
    not read, or in a run without a summary: the cache key stops at that line, and analysis says what the judge
    says (a failed row; unfinished), not "corrupt" for a file the judge never reached."""
    s = H.copy_sweep(sweep, tmp_path / "S")
    run = s / "0"
    if summary == "failed":
        done = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**done, "status": "failed", "error": "RuntimeError: planted"}))
    elif summary == "absent":
        (run / "summary.json").unlink()
    os.truncate(run / "snapshots.jsonl", 2 * H.GiB)
    verdict = contract.judge(run)
    assert verdict.state == {"failed": "failed", "absent": "unfinished", "done": "corrupt"}[summary], verdict
    df = load_runs(s, cache=True, progress=False)
    rows = dict(zip(df["run"], df["status"]))
    skipped = {Path(x["path"]).name: x for x in df.attrs["skipped"]}
    if verdict.state in contract.STATUSES:
        assert rows["0"] == verdict.state and "0" not in skipped
    else:
        assert "0" not in rows and (skipped["0"]["status"], skipped["0"]["reason"]) == (verdict.state, verdict.why)
    again = load_runs(s, progress=False)   # through the cache: the same
    assert dict(zip(again["run"], again["status"])) == rows


# ------------------------------------------------------------------------------ the launcher agrees
GRID = ["data.p=0.5,1", "seed=0,1,2"]   # folders 0..5: (0.5, 0), (0.5, 1), (0.5, 2), (1, 0), (1, 1), (1, 2)


@pytest.mark.e2e
def test_a_relaunch_retrains_each_damaged_run_with_one_line_and_skips_the_rest(tmp_path):
    s = tmp_path / "S"
    r = launch("-m", *GRID, *S, f"hydra.sweep.dir={s}")
    assert r.returncode == 0, r.stderr
    # four damages, four runs; runs 4 and 5 stay as they were
    f = s / "0" / "summary.json"
    f.write_bytes(b"\0" * f.stat().st_size)
    (s / "1" / "summary.json").unlink()
    (s / "1" / "summary.json").symlink_to("/dev/zero")
    h = s / "2" / "history.jsonl"
    h.write_text("".join(h.read_text().splitlines(keepends=True)[:3]))
    (s / "3" / "snapshots.jsonl").unlink()
    os.mkfifo(s / "3" / "snapshots.jsonl")
    damaged = {str(s / n): contract.judge(s / n) for n in "0123"}
    assert all(v.state == "corrupt" for v in damaged.values())
    kept = {n: (s / n / "summary.json").read_bytes() for n in "45"}

    r = launch("-m", *GRID, *S, f"hydra.sweep.dir={s}", timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    said = H.retraining_lines(r.stdout)
    assert said == {folder: v.why for folder, v in damaged.items()}   # each once, with the judge's why
    skipped = re.findall(r"^skipped \(done\): .*\[(.*)\]$", r.stdout, re.M)
    assert sorted(skipped) == ["data.p=1 seed=1", "data.p=1 seed=2"]
    assert r.stdout.strip().splitlines()[-1] == f"sweep {s}: 6 runs: 4 done, 2 skipped, 0 failed, 0 diverged"
    for n in "012345":
        assert contract.judge(s / n).state == "done", n
        assert not (s / n / "summary.json").is_symlink() and (s / n / "snapshots.jsonl").is_file()
    assert {n: (s / n / "summary.json").read_bytes() for n in "45"} == kept
    rows = [json.loads((s / n / "history.jsonl").read_text().splitlines()[-1])["step"] for n in "012345"]
    assert rows == [5] * 6
    df = load_runs(s, cache=False, progress=False)
    assert sorted(df["run"]) == list("012345") and set(df["status"]) == {"done"} and not df.attrs["skipped"]
