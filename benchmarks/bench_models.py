"""256 runs of Makkuva et al.'s model, packed in one process, against the peers' ways: one process per run, a
Python loop over the runs in one process, and a torch.func ensemble (stack_module_state + vmap of grad + one
AdamW(foreach=True)), all measured in this invocation.

The model is experiment=makkuva's (a GPT block with n_embd 8, 1 layer, 1 head, MLP 4×, tied embeddings, their
readout bias and AdamW groups, warm-up and cosine, fresh binary-chain batches of 16 every step), with the
sequence length and the step count shrunk (--N, --steps) so that every way fits in minutes. The 256 runs are
16 (p, q) cells × 16 seeds. One process per run is `python launch.py model=gpt …` as a user (or a peer's
script) runs it, timed for --processes runs; the loop trains --loop runs one at a time through the same
trainer; both are scaled to 256 runs by their median per-run time, in model=gpt's default precision (float32,
`precision=auto`) as the packed path they are compared with. The ensemble is a plain torch.nn model trained on the packed path's own initial parameters and batches, in both
precisions, alternating with the packed path (medians of 2); its last training losses are checked against the
packed path's, so both trained the same runs. Every way trains under the same C allocator settings: the
first training call of a process on a CPU has glibc keep large freed blocks (`rw_sweeps.core.allocator`,
process-wide), so the loop, the ensemble and each `launch.py` process get them as the packed path does. The
last line is the ratios; on a GPU it also prints runs per second.

    python benchmarks/bench_models.py [--N 65] [--steps 100] [--processes 3] [--loop 8]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from rw_sweeps.core import trainer  # noqa: E402
from rw_sweeps.core.gpt import model as gpt_model, training as gpt_training  # noqa: E402
from rw_sweeps.sweeps.planner import plan_overrides  # noqa: E402

R = 256


def overrides(N: int, steps: int, device: str) -> list[str]:
    """experiment=makkuva's model and optimiser at the shrunk length and step count, one run's keys."""
    return ["model=gpt", "data=binary_chain", "data.start=stationary", f"data.N={N}", "data.target=all",
            "data.online=true", "data.batch=16", "data.n_test=16", "optim=adamw", "optim.lr=0.002",
            "optim.beta2=0.95", "optim.weight_decay=0.001", "optim.schedule=cosine", "optim.warmup=0.02",
            "model.readout_bias=true", "optim.decay_embeddings=false", f"optim.steps={steps}",
            f"eval_every={steps}", "init=gpt2", f"device={device}", "wandb.mode=disabled"]


def grid(args, precision: str) -> list:
    """The 256 runs, planned as `launch.py -m` plans them: 16 (p, q) cells × 16 seeds."""
    cells = ["data.p=0.2,0.4,0.6,0.8", "data.q=0.2,0.4,0.6,0.8", "seed=range(0,16)", f"precision={precision}"]
    return [spec.cfg for spec in plan_overrides([*overrides(args.N, args.steps, args.device), *cells])]


def packed(cfgs) -> tuple[float, list[float]]:
    """The packed path's wall time and every run's last training loss (its last history row)."""
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / str(i) for i in range(len(cfgs))]
        t0 = time.perf_counter()
        recs = trainer.of(cfgs[0]).train(cfgs, dirs, progress=False)
        wall = time.perf_counter() - t0
    assert all(r.status == "done" for r in recs)
    return wall, [r.history[-1]["train_loss"] for r in recs]


def loop(cfgs) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(cfgs):
            t0 = time.perf_counter()
            trainer.of(c).train([c], [Path(tmp) / str(i)], progress=False)
            out.append(time.perf_counter() - t0)
    return out


class Block(nn.Module):
    """nanoGPT's block as a skilled PyTorch user writes it for vmap: pre-LN, causal attention written out (vmap
    has no batching rule for scaled_dot_product_attention on a CPU and falls back to a loop), GELU MLP."""

    def __init__(self, D: int, H: int, mlp: int):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(D, bias=False), nn.LayerNorm(D, bias=False)
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(D, mlp * D, bias=False), nn.Linear(mlp * D, D, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (z.view(B, T, self.H, D // self.H).transpose(1, 2) for z in self.c_attn(self.ln_1(x)).split(D, 2))
        att = (q @ k.transpose(-2, -1)) * (D // self.H) ** -0.5
        a = att.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1) @ v
        x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class Makkuva(nn.Module):
    """Makkuva et al.'s model in torch.nn: learned token and position embeddings, blocks, a final LayerNorm and
    lm_head = nn.Linear(D, K, bias=True) whose weight is the token embedding's (tied)."""

    def __init__(self, K: int, T: int, D: int, H: int, L: int, mlp: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(K, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block(D, H, mlp) for _ in range(L))
        self.ln_f, self.lm_head = nn.LayerNorm(D, bias=False), nn.Linear(D, K, bias=True)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[-1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def _module_of(p: dict, r: int, cfg, dtype) -> Makkuva:
    """Run r's initial parameters (the packed path's own draw) in the torch.nn model: the same runs."""
    m, K, N = cfg.model, cfg.data.K, cfg.data.N
    ref = Makkuva(K, N - 1, m.d_model, m.n_head, m.n_layer, m.mlp).to(dtype)
    missing, unexpected = ref.load_state_dict(gpt_model.nanogpt_state(p, r, m.n_layer), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # the head is wte, tied
    return ref


def ensemble(cfgs, precision: str) -> tuple[float, list[float]]:
    """The peers' many-model idiom: R torch.nn models stacked with torch.func.stack_module_state, one vmap of
    grad over them, one AdamW(foreach=True) over the stacked tensors (their decay groups, their schedule) —
    the same runs, batches and steps as the packed path. Returns its wall time and every run's training loss
    on the batch after the last step (the packed path's last history row), so the two are checked alike."""
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    dtype = getattr(torch, precision)
    c, K, T = cfgs[0], cfgs[0].data.K, cfgs[0].optim.steps
    t0 = time.perf_counter()
    p0 = gpt_model.init_params(cfgs, K, c.data.N, dtype)
    models = [_module_of(p0, r, c, dtype) for r in range(len(cfgs))]
    params, buffers = stack_module_state(models)
    with torch.device("meta"):  # built there: .to("meta") would untie lm_head from wte
        base = Makkuva(K, c.data.N - 1, c.model.d_model, c.model.n_head, c.model.n_layer, c.model.mlp)

    def loss(p, b, x, y):
        return F.cross_entropy(functional_call(base, (p, b), (x,)).reshape(-1, K), y.reshape(-1))

    step = vmap(grad_and_value(loss))
    decayed = [n for n, mod in models[0].named_modules() if isinstance(mod, nn.Linear) and n != "lm_head"]
    decay = [params[n + ".weight"] for n in decayed]
    rest = [v for n, v in params.items() if n.rsplit(".", 1)[0] not in decayed]
    o = c.optim
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=o.lr, betas=(o.beta1, o.beta2), eps=o.adam_eps, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, o.lr_factor)
    for t in range(T):
        b = gpt_training._batch_of(cfgs, t, "cpu")
        g, _ = step(params, buffers, b.x, b.y)
        for n, v in params.items():
            v.grad = g[n]
        opt.step()
        sched.step()
    with torch.no_grad():
        b = gpt_training._batch_of(cfgs, T, "cpu")
        last = vmap(loss)(params, buffers, b.x, b.y).tolist()
    return time.perf_counter() - t0, last


def processes(args, cfgs) -> list[float]:
    """One `python launch.py` per run, as a user (or a peer's script) runs it."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, c in enumerate(cfgs):
            cmd = [sys.executable, str(ROOT / "launch.py"), *overrides(args.N, args.steps, args.device),
                   f"data.p={c.data.p}", f"data.q={c.data.q}", f"seed={c.seed}", f"hydra.run.dir={tmp}/{r}"]
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=int, default=65, help="sequence length (Makkuva et al.: 1025)")
    ap.add_argument("--steps", type=int, default=100, help="training steps (Makkuva et al.: 400)")
    ap.add_argument("--processes", type=int, default=3, help="runs timed as one process each")
    ap.add_argument("--loop", type=int, default=8, help="runs timed in the Python loop")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cfgs = {pr: grid(args, pr) for pr in ("float64", "float32")}
    assert len(cfgs["float64"]) == R
    print(f"{R} runs: Makkuva's model (d_model 8, 1 layer, tied, readout bias), N={args.N}, {args.steps} AdamW "
          f"steps, online batches of 16, on {args.device}", flush=True)
    own = grid(args, "auto")[0].precision  # model=gpt's own, what a user's command trains in
    t_proc = processes(args, cfgs[own][: args.processes])
    print(f"one process per run ({own}): {', '.join(f'{t:.2f}' for t in t_proc)} s per run (median "
          f"{statistics.median(t_proc):.2f} s) → {R} runs ≈ {R * statistics.median(t_proc):.1f} s", flush=True)
    t_loop = loop(cfgs[own][: args.loop])
    print(f"loop in one process ({own}): median {statistics.median(t_loop):.3f} s per run over {args.loop} → "
          f"{R} runs ≈ {R * statistics.median(t_loop):.1f} s", flush=True)
    ratio = {}
    for pr in ("float64", "float32"):
        walls = {"packed": [], "vmap": []}
        for _ in range(2):   # alternating, medians: the two share this machine's cores
            t_pack, ours = packed(cfgs[pr])
            t_ens, theirs = ensemble(cfgs[pr], pr)
            walls["packed"].append(t_pack)
            walls["vmap"].append(t_ens)
        worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
        assert worst < (1e-9 if pr == "float64" else 1e-3), f"the ensemble trained other runs ({worst:.1e})"
        tp, te = statistics.median(walls["packed"]), statistics.median(walls["vmap"])
        ratio[pr] = te / tp
        print(f"{pr}: packed {tp:.2f} s, vmap ensemble {te:.2f} s for {R} runs (the same runs: last losses agree "
              f"to {worst:.0e})", flush=True)
        if pr == own:
            t_own = tp
        if args.device.startswith("cuda"):
            print(f"runs per second (packed, {pr}): {R / tp:.1f}")
    print(f"packed vs one process per run: {R * statistics.median(t_proc) / t_own:.1f}x; packed vs loop: "
          f"{R * statistics.median(t_loop) / t_own:.1f}x ({own}); packed vs the vmap ensemble: "
          f"{ratio['float64']:.2f}x float64, {ratio['float32']:.2f}x float32")


if __name__ == "__main__":
    main()
