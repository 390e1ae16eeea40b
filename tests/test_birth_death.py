"""The birth–death family: its Π, its sampler drawing from it, the engine equal to the literal model on it,
and zero-init GD reaching its optimum from the command line."""
from __future__ import annotations

import pytest

from rw_sweeps.core import data as data_mod
from rw_sweeps.core.config import data_config

from .conftest import launch, summaries
from .test_chains import _engine_equals_oracle, assert_draws_follow_pi


def test_its_pi_steps_up_with_p_and_is_held_at_the_ends():
    P = data_config("birth_death", K=4, p=0.7).transition()
    q = 1 - 0.7
    assert P.tolist() == [[q, 0.7, 0, 0], [q, 0, 0.7, 0], [0, q, 0, 0.7], [0, 0, q, 0.7]]
    assert data_config("birth_death", p=0.2).opt_acc == 0.8


def test_its_sampler_draws_from_its_pi():
    d = data_config("birth_death", K=5, N=41, p=0.35, n_train=4000, n_test=10)
    train, _ = data_mod.make(d, 3)
    assert_draws_follow_pi(d, train)


def test_the_engine_equals_the_literal_model_on_it(tmp_path):
    c, rec, V = _engine_equals_oracle(dict(name="birth_death", K=4, p=0.3), tmp_path)
    assert c.data.name == "birth_death" and rec.status == "done"


@pytest.mark.e2e
def test_zero_init_learns_its_optimum_from_the_command_line(tmp_path):
    r = launch("-m", "data=birth_death", "data.K=4", "data.N=21", "data.p=0.2,0.9", "model.M=100", "data.n_train=200",
               "data.n_test=200", "optim.steps=100", "wandb.mode=disabled", f"hydra.sweep.dir={tmp_path / 's'}")
    assert r.returncode == 0, r.stderr
    runs = summaries(tmp_path / "s")
    assert sorted(s["opt_acc"] for s in runs.values()) == [0.8, 0.9]
    for s in runs.values():
        assert s["status"] == "done" and s["data"] == "birth_death"
        # within a test set's error of OPT (200 sequences): the walk is held near one end, where the token
        # histogram alone says where it is, so the attention need not sit on the parent
        assert s["test_acc"] >= s["opt_acc"] - 0.06 and s["trap"] is False, s
