"""model=gpt: eq. 2.1 as a special case, run for run; the batched model against a plain torch.nn one; packed
runs against runs alone; resume bit for bit; a diverging run alone in its failure; the baselines."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rw_sweeps.core import markov, results, trainer
from rw_sweeps.core.config import ConfigError, from_dict
from rw_sweeps.core.gpt import model as gpt_model
from rw_sweeps.core.gpt import training as gpt_training
from rw_sweeps.core.gpt.strategies import in_context

from .conftest import launch
from .test_config import composed

SMALL_EQ21 = ["data.K=3", "data.N=9", "data.p=0.3", "data.n_train=64", "data.n_test=64", "optim.steps=50"]


def _train(cfgs, dirs=None, resumed=None):
    dirs = dirs or [Path(tempfile.mkdtemp()) for _ in cfgs]
    return trainer.of(cfgs[0]).train(cfgs, dirs, progress=False, resumed=resumed)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


@pytest.mark.parametrize("init", [["init=zero"], ["init=gaussian", "init.sigma=0.05", "init.draw=dense"]])
def test_gpt_eq21_equals_the_exact_engine_run_for_run(init):
    """The generic model under conf/model/gpt_eq21.yaml is eq. 2.1: every evaluation of 50 GD steps agrees
    with model=transformer to 1e-8 relative (test_acc, train_loss, parent_attention, test_loss, test_kl)."""
    exact = composed("model=transformer", "model.M=12", *SMALL_EQ21, *init)
    generic = composed("model=gpt_eq21", "model.M=12", *SMALL_EQ21, *init)
    assert generic.model.normalize == exact.model.normalize  # the protocol's auto: whole for gaussian, none for zero
    a, b = _train([exact])[0], _train([generic])[0]
    assert a.status == b.status == "done" and len(a.history) == len(b.history) == 51
    worst = max(_rel(ra[k], rb[k]) for ra, rb in zip(a.history, b.history)
                for k in ("test_acc", "train_loss", "parent_attention", "test_loss", "test_kl"))
    assert worst < 1e-8, worst
    assert a.history[-1]["train_loss"] < a.history[0]["train_loss"] - 0.5  # it learned: not a comparison of two no-ops


class NanoBlock(nn.Module):
    """nanoGPT's Block, written plainly: pre-LN, causal self-attention, GELU MLP."""

    def __init__(self, D, H, mlp, bias):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(D, bias=bias), nn.LayerNorm(D, bias=bias)
        self.c_attn = nn.Linear(D, 3 * D, bias=bias)
        self.c_proj = nn.Linear(D, D, bias=bias)
        self.c_fc, self.mlp_proj = nn.Linear(D, mlp * D, bias=bias), nn.Linear(mlp * D, D, bias=bias)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (z.view(B, T, self.H, D // self.H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.H)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        self.att = att.detach()  # (B, H, T, T): the map the attention readings are defined on
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, K, T, D, H, L, mlp, bias):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(K, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(NanoBlock(D, H, mlp, bias) for _ in range(L))
        self.ln_f = nn.LayerNorm(D, bias=bias)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied


def _load(ref: NanoGPT, p: dict, r: int, L: int) -> None:
    """Run r's batched parameters into the nn.Module (gpt_model.nanogpt_state: x·M against nn.Linear's x·Wᵀ)."""
    _, unexpected = ref.load_state_dict(gpt_model.nanogpt_state(p, r, L), strict=False)
    assert not unexpected, unexpected


GPT = ["model=gpt", "model.n_layer=2", "model.n_head=2", "model.d_model=8", "data=binary_chain", "data.p=0.3",
       "data.q=0.6", "data.N=12", "data.target=all", "data.online=true", "data.batch=8", "data.n_test=16",
       "optim=adamw", "optim.lr=0.01", "optim.steps=12", "optim.schedule=cosine", "optim.warmup=0.25",
       "optim.clip=0.5", "optim.beta2=0.95", "optim.weight_decay=0.1", "init=gpt2",
       "precision=float64"]  # model=gpt's own is float32; the exactness checks need float64


def test_batched_gpt_equals_a_plain_torch_nn_nanogpt_trained_by_torch_optim():
    """The batched model and its AdamW (warm-up, cosine, clipping, decay on matrices and embeddings only)
    against nanoGPT's block in torch.nn trained by torch.optim.AdamW and clip_grad_norm_: every training
    loss of 12 steps, and the final parameters, to 1e-10."""
    cfgs = [composed(*GPT, f"seed={s}") for s in (3, 4)]
    c = cfgs[0]
    K, N, L = c.data.K, c.data.N, c.model.n_layer
    p0 = gpt_model.init_params(cfgs, K, N, torch.float64)
    recs = _train(cfgs)
    for r, cfg in enumerate(cfgs):
        ref = NanoGPT(K, N - 1, 8, 2, L, 4, False).double()
        _load(ref, p0, r, L)
        decay = [p for n, p in ref.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in ref.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                lr=0.01, betas=(0.9, 0.95), eps=1e-8)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: cfg.optim.lr_factor(t))
        losses = []
        for t in range(cfg.optim.steps):
            batch = gpt_training._batch_of([cfg], t, "cpu")
            logits = ref(batch.x[0])
            loss = F.cross_entropy(logits.reshape(-1, K), batch.y[0].reshape(-1))
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            opt.step()
            sched.step()
        ours = [row["train_loss"] for row in recs[r].history][:-1]
        assert len(ours) == len(losses) == 12
        assert max(_rel(a, b) for a, b in zip(ours, losses)) < 1e-10
        assert losses[-1] != losses[0]


@pytest.mark.parametrize("target", ["all", "last"])
def test_the_attention_readings_equal_their_definitions_on_a_plain_nanogpt_s_whole_maps(target, monkeypatch):
    """An evaluation reads each block's attention a few query rows at a time (`gpt.rows`, here one row a
    block); its readings equal their definitions on the whole maps of a plain torch.nn nanoGPT with the runs'
    parameters, to 1e-12: the weight on the parents of what each position read predicts (mean over test
    sequences and positions), the induction score (the weight from position i to the one after x_i's previous
    occurrence, mean over the positions that have one), the last row's spread, and the snapshot's last row."""
    from rw_sweeps.core.gpt import rows
    monkeypatch.setattr(rows, "BLOCK", 1)
    L, H = 2, 2
    cfgs = [composed(*GPT, f"data.target={target}", "init=gaussian", "init.sigma=0.6", f"seed={s}") for s in (0, 1, 2)]
    c0 = cfgs[0]
    _, test = gpt_training._sets(cfgs, torch.float64, "cpu")
    params = gpt_model.init_params(cfgs, 2, c0.data.N, torch.float64)
    eps = torch.zeros(3, dtype=torch.float64)
    row, snap = gpt_training.evaluate(params, test, c0, eps, snapshot=True)
    T = test.x.shape[-1]
    for r, cfg in enumerate(cfgs):
        ref = NanoGPT(2, T, 8, H, L, 4, False).double()
        _load(ref, params, r, L)
        x = test.x[r]
        with torch.no_grad():
            ref(x)
        of = cfg.data.parents_of(cfg.seed)
        read = range(T) if target == "all" else [T - 1]
        spread = 0.0
        for l, blk in enumerate(ref.blocks):
            S = blk.att  # (n, H, T, T)
            for h in range(H):
                parent = np.mean([sum(S[n, h, i, j - 1].item() for j in of[i + 1]) if i + 2 <= len(of) else 0.0
                                  for n in range(len(x)) for i in read])
                assert abs(row["attn_parent"][r, l, h].item() - parent) < 1e-12
                queries = read if l == L - 1 else range(T)  # the last block computes only the positions read
                anchors = [(n, i, max(j for j in range(i) if x[n, j] == x[n, i]))
                           for n in range(len(x)) for i in queries if (x[n, :i] == x[n, i]).any()]
                induction = np.mean([S[n, h, i, j + 1].item() for n, i, j in anchors])
                assert abs(row["induction"][r, l, h].item() - induction) < 1e-12
                spread = max(spread, (S[:, h, -1].amax(-1) - S[:, h, -1].amin(-1)).max().item())
            assert torch.allclose(snap["attention"][l][r], S[:, :, -1].mean(0), rtol=0, atol=1e-12)
        assert abs(row["attention_spread"][r].item() - spread) < 1e-12 and spread > 0.05  # not the uniform map
        assert abs(row["parent_attention"][r].item() - row["attn_parent"][r, 0].mean().item()) < 1e-15


def test_a_gaussian_init_gpt_trains_without_eq21_s_normalisation():
    """normalize=auto is the paper's protocol for its merged attention only: a qkv gpt resolves it to none."""
    cfg = composed("model=gpt", "init=gaussian", "init.sigma=0.02", "optim=adamw", "optim.steps=3")
    assert cfg.model.normalize == "none" and composed("model=gpt_eq21", "init=gaussian").model.normalize == "whole"
    rec = _train([cfg])[0]
    assert rec.status == "done" and rec.history[-1]["train_loss"] < rec.history[0]["train_loss"]


def test_a_packed_gpt_run_equals_the_same_run_alone():
    """Three runs of one shape (other seeds, learning rates) trained as one batch equal each alone to 1e-10."""
    cfgs = [composed(*GPT, f"seed={s}", f"optim.lr={lr}") for s, lr in ((0, 0.01), (1, 0.003), (2, 0.02))]
    packed = _train(cfgs)
    for cfg, rec in zip(cfgs, packed):
        alone = _train([cfg])[0]
        for a, b in zip(alone.history, rec.history):
            for k in ("train_loss", "test_loss", "kl_bigram", "parent_attention"):
                assert _rel(a[k], b[k]) < 1e-10, (k, a[k], b[k])
            assert np.allclose(a["induction"], b["induction"], rtol=1e-10, atol=1e-14, equal_nan=True)


def test_a_resumed_gpt_run_equals_an_uninterrupted_one_bit_for_bit(tmp_path):
    """Checkpointed at step 7 (checkpoint_every=7) and resumed: every history row equals the uninterrupted
    run's exactly."""
    cfg = composed(*GPT, "checkpoint_every=7")
    whole = _train([composed(*GPT)])[0]
    _train([cfg], [tmp_path])  # leaves its checkpoint of step 7 (the last multiple of 7 before 12)
    blob = results.load_checkpoint(cfg.to_dict(), tmp_path)
    assert blob["state"]["step"] == 7 and len(blob["history"]) == 7
    resumed = _train([cfg], [tmp_path], resumed=[blob])[0]
    assert resumed.history == whole.history


def test_a_diverging_gpt_run_never_disturbs_the_others():
    """A run with lr = 1e300 diverges (status, step) while its batch-mates equal themselves alone."""
    cfgs = [composed(*GPT, "seed=1"), composed(*GPT, "seed=3", "optim.lr=1e300"), composed(*GPT, "seed=2")]
    recs = _train(cfgs)
    assert recs[1].status == "diverged" and recs[1].steps < 12 and len(recs[1].history) <= recs[1].steps + 1
    for i in (0, 2):
        alone = _train([cfgs[i]])[0]
        assert recs[i].status == "done" and len(recs[i].history) == 13
        assert max(_rel(a["train_loss"], b["train_loss"]) for a, b in zip(alone.history, recs[i].history)) < 1e-10


def test_the_baselines_are_the_entropy_rate_and_the_stationary_entropy():
    """On the binary chain started at its stationary law, with the next-token objective, opt_loss is the
    entropy rate and unigram_loss the entropy of π (within sampling error of 4096 × 63 positions)."""
    p, q = 0.1, 0.2
    cfg = composed("model=gpt", "data=binary_chain", f"data.p={p}", f"data.q={q}", "data.start=stationary",
                   "data.N=64", "data.target=all", "data.n_train=8", "data.n_test=4096", "optim=adamw",
                   "optim.steps=1", "model.mlp=0")
    rec = _train([cfg])[0]
    pi = np.array([q, p]) / (p + q)
    H = lambda x: -sum(v * math.log(v) for v in x if v > 0)  # noqa: E731
    rate = pi[0] * H([1 - p, p]) + pi[1] * H([q, 1 - q])
    row = rec.history[-1]
    assert abs(row["opt_loss"] - rate) < 0.01 and abs(row["unigram_loss"] - H(pi)) < 0.01
    assert row["unigram_loss"] - row["opt_loss"] > 0.05  # the two are told apart


def test_the_in_context_bigram_at_the_last_position_is_the_posterior_predictive():
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 3, size=(50, 20))
    _, bigram = in_context(seq, 3, 0.7, "last")
    np.testing.assert_allclose(bigram[:, 0], markov.posterior_predictive(seq[:, :-1], 3, 0.7), rtol=1e-14)
    uni_all, big_all = in_context(seq, 3, 0.7, "all")
    np.testing.assert_allclose(big_all[:, -1], bigram[:, 0])
    np.testing.assert_allclose(uni_all[:, 0], (np.eye(3)[seq[:, 0]] + 0.7) / (1 + 3 * 0.7))


def test_online_batches_are_each_familys_own_sampler_run_by_run():
    """The stacked first-order sampler draws exactly what each run's own `draw` draws."""
    for family, keys in (("binary_chain", {"p": 0.3, "q": 0.1, "start": "stationary"}), ("lazy_walk", {}),
                         ("icl_markov", {}), ("random_walk", {"p": 0.7}), ("bayes_net", {"in_context": True})):
        cfgs = [from_dict({"data": {"name": family, "N": 10, **keys}, "seed": s}) for s in (0, 5)]
        gens = lambda: [torch.Generator().manual_seed(7 + s) for s in range(2)]  # noqa: E731
        many = cfgs[0].data.draw_many([c.data for c in cfgs], 6, gens(), [0, 5])
        for d, g, s, got in zip([c.data for c in cfgs], gens(), [0, 5], many):
            own = d.draw(6, g, s)
            assert torch.equal(own.tokens, got.tokens) and torch.equal(own.y, got.y), family


@pytest.mark.parametrize("overrides, line", [
    (["model=transformer", "data.target=all"], "data.target='all': model=transformer predicts x_N only"),
    (["model=transformer", "data.online=true"], "data.online=True: model=transformer trains full-batch"),
    (["model=gpt", "data=qa_majority", "data.target=all"], "data.target='all': data=qa_majority has no law at every position"),
    (["model=gpt", "model.n_head=3"], "model.n_head=3: must divide the width (8)"),
    (["model=gpt", "model.attention=merged"], "model.attention='merged': needs model.embed=fixed"),
    (["model=transformer", "optim=adamw", "optim.schedule=cosine"],
     "optim.schedule='cosine': the eq21 engine takes optim.schedule=constant only (model=gpt serves schedules"),
])
def test_a_model_option_refuses_what_it_cannot_train_in_one_line(overrides, line):
    with pytest.raises(ConfigError) as e:
        composed(*overrides)
    assert line in str(e.value)


@pytest.mark.e2e
def test_launch_trains_the_peers_objective_and_prints_its_baselines(tmp_path):
    r = launch("model=gpt", "data=binary_chain", "data.p=0.8", "data.q=0.8", "data.target=all", "data.online=true",
               "optim=adamw", "data.N=32", "optim.steps=30", "data.n_test=64", "eval_every=10",
               "wandb.mode=offline", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert "wandb logging failed" not in r.stdout + r.stderr and list(tmp_path.glob("wandb/*/*.wandb"))
    line = next(x for x in (r.stdout + r.stderr).splitlines() if "done:" in x)
    vals = {k: float(line.split(f"{k}=")[1].split()[0]) for k in ("test_loss", "opt_loss", "unigram_loss")}
    assert abs(vals["unigram_loss"] - math.log(2)) < 0.02  # π = (1/2, 1/2) for p = q
    assert vals["opt_loss"] < vals["unigram_loss"] - 0.1
    assert vals["opt_loss"] - 0.02 < vals["test_loss"] < vals["unigram_loss"] + 0.05


@pytest.mark.e2e
def test_an_interrupted_gpt_sweep_resumes_to_the_uninterrupted_files(tmp_path):
    """Ctrl-C mid-training checkpoints both packed gpt runs (exit 130); the same command again resumes them,
    and their history.jsonl equals that of the same sweep run without interruption, byte for byte."""
    import signal

    from .conftest import start_launch, wait_for_training, wait_for_work

    # ~5 ms a step here: the interrupt, after 1 s of the launch's CPU in training, lands near step 200 of 2,000
    args = ["-m", *GPT, "optim.steps=2000", "eval_every=250", "seed=0,1", "wandb.mode=disabled"]
    whole = launch(*args, f"hydra.sweep.dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr
    cut = [*args, f"hydra.sweep.dir={tmp_path / 'cut'}"]
    p = start_launch(*cut)
    wait_for_training(p)
    wait_for_work(p.pid, 1.0, what="the runs to take steps")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=120)
    assert p.returncode == 130
    steps = [torch.load(tmp_path / "cut" / n / "checkpoint.pt", weights_only=True)["state"]["step"] for n in "01"]
    assert all(0 < s < 2000 for s in steps), steps
    again = launch(*cut)
    assert again.returncode == 0 and "from its checkpoint at step" in again.stdout, again.stderr
    for n in "01":
        assert (tmp_path / "cut" / n / "history.jsonl").read_bytes() == (tmp_path / "whole" / n / "history.jsonl").read_bytes()


def test_relative_loss_is_null_with_its_reason_where_the_output_is_not_a_distribution():
    """relative_loss compares the model's loss with the Bayes and unigram losses of distributions. Eq. 2.1's f
    (model.readout=linear) is not one: −log(f_y + ε) can go below the Bayes loss, so there it is null and the
    summary says why; with a softmax readout it is (test_loss − opt_loss)/(unigram_loss − opt_loss), and null
    where the two baselines coincide (p + q = 1)."""
    eq21 = _train([composed("model=gpt_eq21", "model.M=12", *SMALL_EQ21)])[0]
    s = gpt_training.summary(eq21, 0.0)
    assert s["relative_loss"] is None and s["opt_loss"] is not None
    assert s["relative_loss_null"].startswith("model.readout=linear: the output f is not a distribution")
    soft = [composed(*GPT, f"data.p={p}", f"data.q={q}", "optim.steps=5") for p, q in ((0.3, 0.1), (0.4, 0.6))]
    state, coincide = (gpt_training.summary(r, 0.0) for r in _train(soft))
    assert state["relative_loss"] == pytest.approx((state["test_loss"] - state["opt_loss"])
                                                   / (state["unigram_loss"] - state["opt_loss"]), rel=1e-12)
    assert state["relative_loss_null"] is None and state["relative_loss"] > 0
    assert coincide["relative_loss"] is None and "baselines coincide" in coincide["relative_loss_null"]


class MakkuvaGPT(NanoGPT):
    """Makkuva et al.'s readout, written plainly: lm_head = nn.Linear(D, K, bias=True), its weight the token
    embedding's when tied (their `self.transformer.wte.weight = self.lm_head.weight`)."""

    def __init__(self, K, T, D, H, L, mlp, bias, tie):
        super().__init__(K, T, D, H, L, mlp, bias)
        self.lm_head = nn.Linear(D, K, bias=True)
        if tie:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


@pytest.mark.parametrize("tie", [True, False])
def test_the_readout_bias_and_undecayed_embeddings_equal_makkuva_et_al_s_torch_model(tie):
    """model.readout_bias=true with optim.decay_embeddings=false against a torch.nn model with
    nn.Linear(D, K, bias=True) as lm_head and the older nanoGPT's AdamW groups (their code's): nn.Linear
    weights decayed; embeddings (the tied readout with them), LayerNorm gains and biases not. Every training
    loss of 12 steps to 1e-10, the bias moved off its zero init, and each switch changes the run."""
    extra = [f"model.tie={str(tie).lower()}", "model.readout_bias=true", "optim.decay_embeddings=false"]
    cfgs = [composed(*GPT, *extra, f"seed={s}") for s in (3, 4)]
    c = cfgs[0]
    K, N, L = c.data.K, c.data.N, c.model.n_layer
    p0 = gpt_model.init_params(cfgs, K, N, torch.float64)
    assert torch.equal(p0["lm_head.b"], torch.zeros(2, K, dtype=torch.float64))
    recs = _train(cfgs)
    for r, cfg in enumerate(cfgs):
        ref = MakkuvaGPT(K, N - 1, 8, 2, L, 4, False, tie).double()
        _load(ref, p0, r, L)
        with torch.no_grad():
            ref.lm_head.bias.zero_()
            if not tie:
                ref.lm_head.weight.copy_(p0["lm_head"][r])
        linear = {id(m.weight) for m in ref.modules() if isinstance(m, nn.Linear)} - {id(ref.wte.weight)}
        decay = [p for p in ref.parameters() if id(p) in linear]
        rest = [p for p in ref.parameters() if id(p) not in linear]
        assert len(decay) == 4 * L + (0 if tie else 1)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                lr=0.01, betas=(0.9, 0.95), eps=1e-8)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: cfg.optim.lr_factor(t))
        losses = []
        for t in range(cfg.optim.steps):
            batch = gpt_training._batch_of([cfg], t, "cpu")
            loss = F.cross_entropy(ref(batch.x[0]).reshape(-1, K), batch.y[0].reshape(-1))
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            opt.step()
            sched.step()
        ours = [row["train_loss"] for row in recs[r].history][:-1]
        assert max(_rel(a, b) for a, b in zip(ours, losses)) < 1e-10
        assert ref.lm_head.bias.abs().max() > 1e-4
    for flip in ("model.readout_bias=false", "optim.decay_embeddings=true"):
        other = _train([composed(*GPT, *extra, flip, "seed=3")])[0]
        assert other.history[-1]["train_loss"] != recs[0].history[-1]["train_loss"], flip


def test_the_readout_bias_is_refused_without_a_softmax_readout():
    with pytest.raises(ConfigError, match=r"model\.readout_bias=True: applies to model\.readout=softmax only"):
        composed("model=gpt_eq21", "model.readout_bias=true")
