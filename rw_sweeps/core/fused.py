"""The fused training step: `engine.train_step` / `engine.evaluate` for eq. 2.1 as one compiled C loop.

Same math, same State / Batch / Probe objects, same results (float64: ~1e-15 of each quantity's scale;
Thm 4.1's symmetric point stays exact, bit for bit, in both precisions), one to two orders of magnitude
faster (benchmarks/bench_engine.py): `fused.c` keeps a run's uint8 tokens in L2 across its steps and does
the two O(n·N) passes of the factorised softmax (token histogram, gather-sum) in AVX-512.

Compiled by gcc on first use and cached in ~/.cache/rw_sweeps (or $RW_SWEEPS_CACHE), one shared object per
(source, flags, compiler, CPU), written to a temp name and renamed so concurrent jobs never load half a
file; a build the compiler refuses (a status and a message, not a signal) leaves `<name>.failed` (its output)
beside it for a day, so that the next processes go straight to the next, more portable build (delete the file
to retry at once). Covers GD on model=transformer with the exact Gram, every model.normalize, float64 and float32,
K ≤ 127, on CPU tensors (AVX-512 for 3 ≤ K ≤ 8; plain C for other K, on CPUs without AVX-512, or with
RW_SWEEPS_FUSED_ISA=generic), for a model option that declares it (`IMPLEMENTATIONS`; one gate, `why_not`).
Everything else — the FFN model, gram=numeric, optim=adam, GPU tensors, no working compiler — runs
`engine`'s PyTorch code; both are implementations of the model option's forward (`ModelConfig.forward`).
RW_SWEEPS_BACKEND=torch|fused|auto (default auto) forces a path (`fused` raises where the kernel cannot
run); RW_SWEEPS_THREADS sets the threads (default torch's count, as it is outside `torch_serial`); runs are
the unit of parallelism, so R = 1 uses one thread.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Optional

import torch

from . import engine, env_vars
from .model import Geometry

SOURCE = Path(__file__).with_name("fused.c")
CC = os.environ.get("CC", "gcc")  # the compiler; tests point it somewhere absent to check the fallback
ABI = int(re.search(r"#define RW_ABI (\d+)", SOURCE.read_text()).group(1))  # fused.c's, its one definition
BASE_FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-math-errno"]
# Build attempts per variant, best first: native ISA with glibc's vector log (libmvec), native ISA, and a
# portable build with no ISA extensions at all (plain C paths only).
VARIANTS = {
    "native": [["-march=native", "-DRW_MVEC"], ["-march=native"], []],
    "generic": [["-DRW_NO_AVX512"]],
}
assert tuple(VARIANTS) == env_vars.ISA_VARIANTS
MAX_K = 127  # tokens travel as bytes



# ----------------------------------------------------------------------------------------------- building
backend, isa_variant = env_vars.backend, env_vars.isa_variant  # RW_SWEEPS_BACKEND, RW_SWEEPS_FUSED_ISA


def cache_dir() -> Path:
    d = os.environ.get("RW_SWEEPS_CACHE")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rw_sweeps"


def _cpu_signature() -> str:
    """What -march=native depends on: the machine, the CPU model and its flags."""
    sig = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features", "CPU part", "CPU implementer"):
                    sig.append(line.strip())
                if line.strip() == "":  # first processor only
                    break
    except OSError:
        sig.append(platform.processor())
    return "\n".join(sig)


def _compiler_version(cc: str) -> Optional[str]:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else None


def _build(cc: str, flags: list[str], version: str, source: Path = SOURCE, link: tuple = ()) -> Path:
    """Compile `source` (this kernel's, or another C kernel written the same way: RW_ONLY=64/32 compiles one
    dtype) once per key and return the shared object; raises on failure. Concurrent processes (SLURM array
    jobs) each compile to a private temp file and rename it into place, so nobody ever loads a half-written
    file. `link`: flags for the compiler and the linker both (-fopenmp)."""
    src = source.read_bytes()
    flags = [*flags, *link]
    libs = ["-lm"] + (["-lmvec"] if "-DRW_MVEC" in flags else []) + list(link)
    cmd_flags = BASE_FLAGS + flags + ["-shared"] + libs
    key = hashlib.sha256(b"\0".join([src, " ".join(cmd_flags).encode(), version.encode(),
                                     _cpu_signature().encode(), str(ABI).encode()])).hexdigest()[:20]
    out_dir = cache_dir()
    try:
        out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = out_dir / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        if not _private(out_dir):
            raise PermissionError(f"{out_dir} is not owned by this user or is writable by others")
    except OSError:  # read-only or foreign home cache: a per-user temp folder instead, if it is ours alone
        out_dir = Path(tempfile.gettempdir()) / f"rw_sweeps-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        try:
            out_dir.mkdir(mode=0o700)
        except FileExistsError:
            pass
        if not _private(out_dir):  # someone else made it, or opened it up: build in a fresh private folder
            out_dir = Path(tempfile.mkdtemp(prefix="rw_sweeps-"))
    target = out_dir / f"{source.stem}-{key}.so"
    if target.exists() and _private(target):
        return target
    failed = out_dir / f"{source.stem}-{key}.failed"  # this very build failed before: not tried in every process
    if _failed_before(failed):
        raise RuntimeError(f"failed before, not tried again (the compiler's output: {failed}; delete it to retry)")
    print(f"rw_sweeps: compiling the {source.stem} kernel into {out_dir} (once per install, ~10 s)",
          file=sys.stderr, flush=True)
    tmpdir = tempfile.mkdtemp(prefix=f".{source.stem}-{key}-", dir=out_dir)
    tmp = os.path.join(tmpdir, "fused.so")
    try:
        # one translation unit per dtype, compiled side by side (the file includes itself once per dtype)
        cmds = [[cc, *BASE_FLAGS, *flags, f"-DRW_ONLY={bits}", "-c", str(source), "-o", os.path.join(tmpdir, f"{bits}.o")]
                for bits in (64, 32)]
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
        errs = [p.communicate(timeout=600)[1] for p in procs]
        for c, p, e in zip(cmds, procs, errs):
            if p.returncode != 0:
                _failure(failed, tmpdir, c, p.returncode, e)
        link_cmd = [cc, "-shared", "-pthread", os.path.join(tmpdir, "64.o"), os.path.join(tmpdir, "32.o"), "-o", tmp, *libs]
        res = subprocess.run(link_cmd, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            _failure(failed, tmpdir, link_cmd, res.returncode, res.stderr)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic: other processes see no file or the whole file
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return target


FAILED_FOR_S = 86400  # a remembered failure is tried again after a day (a compiler fixed, a library installed)


def _failed_before(marker: Path) -> bool:
    """A regular file of ours at the marker's name, younger than FAILED_FOR_S (nothing in it is read)."""
    try:
        st = os.lstat(marker)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and _private(marker) and time.time() - st.st_mtime < FAILED_FOR_S


def _failure(marker: Path, tmpdir: str, cmd: list, returncode: int, stderr: str) -> None:
    """Raise the compiler's complaint; where the compiler itself said no (it exited with a status and a message,
    not killed by a signal: an interrupted or killed build says nothing about the next), first leave it where
    the next process finds it, so that the same failing build is not tried in every process."""
    message = f"{' '.join(cmd)} failed ({'signal ' + str(-returncode) if returncode < 0 else 'status ' + str(returncode)}):\n" \
              f"{stderr[-2000:]}"
    if returncode > 0 and stderr.strip():
        note = os.path.join(tmpdir, "failed")
        try:
            with open(note, "w") as f:
                f.write(message + "\n")
            os.chmod(note, 0o644)  # whatever the umask: a group-writable marker would not be trusted
            os.replace(note, marker)
        except OSError:  # a folder planted at its name, a full disk: the build is tried again next time
            pass
    raise RuntimeError(message)


def _private(path: Path) -> bool:
    """Loading a shared object runs its code: only trust a folder or file owned by this user that no one
    else may write to (a file also must not be a symlink to somewhere else)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False
    if st.st_mode & 0o022:  # group- or world-writable
        return False
    return not (path.is_symlink())


_I64, _I32, _DBL, _PTR = ctypes.c_int64, ctypes.c_int32, ctypes.c_double, ctypes.c_void_p


class TrainArgs(ctypes.Structure):
    """rw_train's arguments: fused.c's rw_train_args, field by field (checked against the library's own
    layout when it is loaded: `_check_layout`)."""
    _fields_ = [*((k, _I64) for k in ("R", "n", "L", "K", "T")), ("tok", _PTR), ("y", _PTR),
                *((k, _PTR) for k in ("V", "a", "c", "lr", "eps", "w")),
                *((k, _DBL) for k in ("kappa", "pp", "nu_tok", "nu_pos", "nu_q")),
                ("loss", _PTR), ("bad_step", _PTR), ("masks", _PTR), ("nthreads", _I32), ("impl", _I32)]


class EvalArgs(ctypes.Structure):
    """rw_eval's arguments: fused.c's rw_eval_args, field by field (checked as TrainArgs is)."""
    _fields_ = [*((k, _I64) for k in ("R", "n", "L", "K")),
                *((k, _PTR) for k in ("tok", "y", "P", "V", "a", "c", "eps")),
                *((k, _DBL) for k in ("nu_tok", "nu_pos", "nu_q")),
                *((k, _PTR) for k in ("loss", "acc", "kl", "pred_dist", "attention", "spread", "h_example",
                                      "h_var", "pred", "gap", "masks", "tokT")),
                ("full", _I32), ("PB", _PTR), ("S", _I32), ("nthreads", _I32), ("impl", _I32)]


def _check_layout(lib: ctypes.CDLL, args: type, which: str) -> None:
    """The library's struct has these fields, in this order, at these offsets, and this size; else the
    library is refused (RuntimeError), so that no call can put a value in another field's place."""
    names = getattr(lib, f"rw_{which}_args_names")().decode().split()
    layout = getattr(lib, f"rw_{which}_args_layout")()
    offsets = [layout[i] for i in range(len(names) + 1)]
    mine = [name for name, _ in args._fields_]
    if names != mine or offsets != [getattr(args, k).offset for k in mine] + [ctypes.sizeof(args)]:
        raise RuntimeError(f"rw_{which}_args layout of the library differs from fused.py's {args.__name__}")


def _declare(lib: ctypes.CDLL) -> None:
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    for which in ("train", "eval"):
        getattr(lib, f"rw_{which}_args_names").restype = ctypes.c_char_p
        getattr(lib, f"rw_{which}_args_layout").restype = ctypes.POINTER(ctypes.c_int64)
    for sfx in ("f64", "f32"):
        f = getattr(lib, f"rw_train_{sfx}")
        f.argtypes, f.restype = [ctypes.POINTER(TrainArgs)], i32
        f = getattr(lib, f"rw_eval_{sfx}")
        f.argtypes, f.restype = [ctypes.POINTER(EvalArgs)], i32
        f = getattr(lib, f"rw_masks_bytes_{sfx}")
        f.argtypes, f.restype = [i64] * 3, i64
        f = getattr(lib, f"rw_masks_{sfx}")
        f.argtypes, f.restype = [i64] * 4 + [vp, vp, i32], i32
    lib.rw_histograms.argtypes, lib.rw_histograms.restype = [i64] * 4 + [vp, vp, i32], i32
    for name in ("rw_abi", "rw_isa", "rw_mvec"):
        getattr(lib, name).restype = ctypes.c_int


def _accept(lib: ctypes.CDLL) -> None:
    _declare(lib)
    if lib.rw_abi() != ABI:
        raise RuntimeError(f"ABI {lib.rw_abi()} != {ABI}")
    _check_layout(lib, TrainArgs, "train")
    _check_layout(lib, EvalArgs, "eval")


def compiled(source: Path, variant: str, accept, links: tuple = ((),)) -> tuple[Optional[ctypes.CDLL], list[str]]:
    """`source` built with the variant's flags, best first (and for each, `links`' alternatives, best first),
    loaded, and accepted (`accept(lib)` declares its functions and raises if it is not the library the caller
    expects): (the library or None, why each build that was tried failed)."""
    errors: list[str] = []
    cc = shutil.which(CC) if CC else None
    version = _compiler_version(cc) if cc else None
    if cc is None or version is None:
        return None, [f"no working C compiler {CC!r} (set CC)"]
    for flags in VARIANTS[variant]:
        for link in links:
            try:
                lib = ctypes.CDLL(str(_build(cc, flags, version, source, tuple(link))))
                accept(lib)
                return lib, errors
            except Exception as exc:  # noqa: BLE001 - try the next, more portable build
                errors.append(f"{[*flags, *link]}: {exc}")
    return None, errors


class Library:
    """One C source's shared object per ISA variant: built on first use (`compiled`), loaded once, cached with
    why each build failed. `accept(lib)` declares its functions and raises if it is not the expected library;
    `links`: the link alternatives, best first; `notice`: how stderr names it when no build works."""

    def __init__(self, source: Path, accept, links: tuple = ((),), notice: str = ""):
        self.source, self.accept, self.links = source, accept, links
        self.notice = notice or f"rw_sweeps: no compiled {source.name}"
        self._lock = threading.Lock()
        self._libs: dict[str, Optional[ctypes.CDLL]] = {}
        self._errors: dict[str, str] = {}

    def library(self, variant: Optional[str] = None) -> Optional[ctypes.CDLL]:
        """The loaded library, compiled on first use; None when no build works (why: `last_error()`)."""
        variant = variant or isa_variant()
        with self._lock:
            if variant not in self._libs:
                self._libs[variant], errors = compiled(self.source, variant, self.accept, self.links)
                self._errors[variant] = "\n".join(errors)
                if self._libs[variant] is None and backend() != "torch":
                    print(f"{self.notice}, using PyTorch ({errors[-1].splitlines()[0]})", file=sys.stderr)
            return self._libs[variant]

    def last_error(self, variant: Optional[str] = None) -> str:
        return self._errors.get(variant or isa_variant(), "")

    def reset(self) -> None:
        """Forget the loaded library (tests: after changing CC, RW_SWEEPS_CACHE or RW_SWEEPS_FUSED_ISA)."""
        with self._lock:
            self._libs.clear()
            self._errors.clear()


_KERNEL = Library(SOURCE, _accept, notice="rw_sweeps.core.fused: no compiled kernel")
library, last_error, reset = _KERNEL.library, _KERNEL.last_error, _KERNEL.reset


def info() -> dict:
    lib = library()
    return {"available": lib is not None, "variant": isa_variant(), "avx512": bool(lib and lib.rw_isa()),
            "vector_log": bool(lib and lib.rw_mvec()), "threads": threads(1 << 30), "error": last_error()}


# ------------------------------------------------------------------------------------------- dispatching
PRECISIONS = {torch.float64: "float64", torch.float32: "float32"}


def why_not(paths: tuple, K: Optional[int], gram: str, precision: str, device: str = "cpu") -> Optional[str]:
    """Why the kernel does not train runs of a model and shape, or None where it does: the one gate of the
    kernel. It runs a model's forward only where the model option declares it (`IMPLEMENTATIONS`, which
    `Geometry.paths` carries: eq. 2.1's, every model.normalize, the logits' scales ν being arguments), with
    the exact Gram, in float64 or float32, on a CPU, for K ≤ 127, under RW_SWEEPS_BACKEND=auto|fused, with
    a build; everything else takes the engine (or the model's reference forward, where it declares no engine)."""
    if backend() == "torch":
        return "RW_SWEEPS_BACKEND=torch"
    why = ("the model option does not declare the kernel" if "kernel" not in paths
           else "gram=numeric" if gram != "exact"
           else f"precision {precision}" if precision not in PRECISIONS.values()
           else "a non-CPU device" if device != "cpu"
           else f"K = {K} (at most {MAX_K})" if K is not None and not 1 <= K <= MAX_K else None)
    if why is None and library() is None:
        why = "no compiled kernel: " + last_error().splitlines()[-1] if last_error() else "no compiled kernel"
    return why


def available(cfg=None, *, K: Optional[int] = None, paths: tuple = ("engine", "kernel"), gram: str = "exact",
              precision: str = "float64") -> bool:
    """Whether `train_step` / `evaluate` run the compiled kernel for runs of this shape (a RunConfig, or
    the keywords; `paths`: the implementations the model option declares, `ModelBase.IMPLEMENTATIONS`):
    `why_not`'s gate, and for a RunConfig its optimiser's steps being the kernel's."""
    if cfg is not None:
        K, paths, gram, precision = cfg.data.K, type(cfg.model).IMPLEMENTATIONS, getattr(cfg.model, "gram", ""), cfg.precision
        if not getattr(type(cfg.optim).ENGINES.get("eq21"), "KERNEL", False):  # its steps are PyTorch's
            return False
    return why_not(paths, K, gram, precision) is None


def _kernel_for(state: engine.State, data: engine.Batch, geo: Geometry) -> Optional[ctypes.CDLL]:
    """The library if the kernel can run these tensors (`why_not`, and the shapes it trusts), else None
    (the engine), or raise if forced."""
    V = state.params["V"]
    devices = {t.device.type for t in (V, state.a, state.c, data.tokens)}
    why = why_not(geo.paths, None, "exact" if geo.gram is None else "numeric", PRECISIONS.get(V.dtype, str(V.dtype)),
                  "cpu" if devices == {"cpu"} else "cuda")
    if why is None and (V.dim() != 3 or V.shape[1] != V.shape[2] or not 1 <= V.shape[2] <= MAX_K):
        why = f"V of shape {tuple(V.shape)}"
    elif why is None and not _shapes_agree(state, data):
        why = (f"shapes: V {tuple(V.shape)}, a {tuple(state.a.shape)}, c {tuple(state.c.shape)}, "
               f"tokens {tuple(data.tokens.shape)}, y {tuple(data.y.shape)}, P_true {tuple(data.P_true.shape)}")
    if why is not None and backend() == "fused":
        raise RuntimeError(f"RW_SWEEPS_BACKEND=fused, but the fused kernel cannot run this batch: {why}")
    return None if why is not None else library()


def _shapes_agree(state: engine.State, data: engine.Batch) -> bool:
    """The kernel trusts these (memory safety): V (R,K,K), a (R,K), c (R,N), tokens (R,n,N−1), y (R,n),
    P_true (R,n,K)."""
    V, tok = state.params["V"], data.tokens
    if tok.dim() != 3 or tok.shape[1] < 1 or tok.shape[2] < 1:
        return False
    R, K, (n, L) = V.shape[0], V.shape[2], tok.shape[1:]
    return (tuple(state.a.shape) == (R, K) and tuple(state.c.shape) == (R, L + 1) and tok.shape[0] == R
            and tuple(data.y.shape) == (R, n) and tuple(data.P_true.shape) == (R, n, K))


def threads(R: int) -> int:
    """Threads for R independent pieces of work: RW_SWEEPS_THREADS, else torch's count (outside
    `torch_serial`), at most R."""
    n = env_vars.threads() or (_cores[-1] if _cores else torch.get_num_threads())
    return max(1, min(n, R))


_cores: list[int] = []  # torch's thread count outside each `torch_serial` scope, innermost last


@contextlib.contextmanager
def torch_serial():
    """torch's own CPU ops on one thread for the scope, the kernels' threads (`threads`) as outside it: for a
    chunk whose parallel work is the compiled kernel. After each parallel op, libgomp's pool threads spin for
    milliseconds on the cores the kernel's next call needs; over the 1,000-run §5 grid that was 5 % of its CPU
    samples (perf, docs/speed.md), and the ops it follows (the initial state, data checks, the trap and
    prediction checks, the flush) are small. Their results do not depend on the split: torch parallelises
    these ops over their outputs, each computed whole by one thread; a reduction with one output (which torch
    splits among its threads) is integer or boolean, but for a one-run chunk's `opt_acc`, which
    `training._train` takes on one thread in every chunk. Run folders written with and without this scope
    are byte-identical (`tests/test_fused.py::test_torch_serial_changes_no_result`, the grids in
    docs/speed.md)."""
    _cores.append(_cores[-1] if _cores else torch.get_num_threads())
    torch.set_num_threads(1)
    try:
        yield
    finally:
        n = _cores.pop()
        torch.set_num_threads(1 if _cores else n)  # an outer scope stays serial


def symmetric_h(data: engine.Batch, K: int, dtype) -> torch.Tensor:
    """engine.symmetric_h (the test histograms / (N − 1)), counted by the kernel on CPU tokens: the same
    integers, so the same values bit for bit, without torch's int64 copy of every token (8 bytes a token;
    200 MB for a chunk of 250 §5 runs)."""
    tokens = data.tokens
    b = backend()
    why = ("a non-CPU device" if tokens.device.type != "cpu" else f"K = {K} (at most {MAX_K})" if not 1 <= K <= MAX_K
           else f"tokens of shape {tuple(tokens.shape)}" if tokens.dim() != 3 else None)
    lib = library() if b != "torch" and why is None else None
    if lib is None:
        if b == "fused":
            raise RuntimeError(f"RW_SWEEPS_BACKEND=fused, but the fused kernel cannot count these histograms: "
                               f"{why or 'no compiled kernel'}")
        return engine.symmetric_h(data, K, dtype)
    R, n, L = tokens.shape
    tok = _as_bytes(tokens, K)
    counts = torch.empty(R, n, K, dtype=torch.int32)
    if lib.rw_histograms(R, n, L, K, _ptr(tok), _ptr(counts), threads(R)) != 0:
        raise RuntimeError("fused kernel rw_histograms failed")
    return counts.to(dtype) / L


# per token tensor (a Batch's): its uint8 copy and its masks, dropped when the tensor is freed
_bytes_cache: dict[int, tuple] = {}


def _as_bytes(t: torch.Tensor, K: int) -> torch.Tensor:
    """Token ids as uint8, converted once per tensor (and version); checks 0 ≤ id < K, which the kernel
    relies on for memory safety."""
    key = id(t)
    hit = _bytes_cache.get(key)
    if hit is not None and hit[0]() is t and hit[1] == t._version and hit[2] <= K:
        return t if hit[3] is None else hit[3]
    lo, hi = (int(v) for v in t.aminmax()) if t.numel() else (0, -1)
    if lo < 0 or hi >= K:
        raise ValueError(f"token ids must lie in [0, {K})")
    u8 = t.detach().to(torch.uint8).contiguous()
    kmax = hi + 1
    # bytes already (a Batch made for the kernel): only the check is remembered, never a reference to t
    _remember(_bytes_cache, key, t, (weakref.ref(t), t._version, kmax, None if u8 is t else u8))
    return u8


def _remember(cache: dict, key, owner: torch.Tensor, entry: tuple) -> None:
    """Cache an entry for as long as `owner` (a Batch's token tensor) lives, and no longer."""
    if key not in cache:
        weakref.finalize(owner, cache.pop, key, None)
    cache[key] = entry


_masks_cache: dict[tuple, tuple] = {}


def _per_tensor(cache: dict, key, owner: torch.Tensor, build):
    """build(), cached for as long as `owner` (a Batch's tensor) lives unchanged; a None result is not kept."""
    hit = cache.get(key)
    if hit is not None and hit[0]() is owner and hit[1] == owner._version:
        return hit[2]
    value = build()
    if value is not None:
        _remember(cache, key, owner, (weakref.ref(owner), owner._version, value))
    return value


def _masks(lib, tokens: torch.Tensor, tok8: torch.Tensor, K: int, dtype) -> Optional[torch.Tensor]:
    """The AVX-512 histogram masks of these tokens (72 KB per §5 run), built once per token tensor, for the
    calls that would otherwise rebuild them every time: single steps and evaluations. None where the
    kernel takes its plain C path."""
    sfx = "f64" if dtype == torch.float64 else "f32"
    R, n, L = tok8.shape
    per_run = getattr(lib, f"rw_masks_bytes_{sfx}")(n, L, K)
    if per_run <= 0:
        return None

    def build() -> Optional[torch.Tensor]:
        out = torch.empty(R * per_run, dtype=torch.uint8)
        return out if getattr(lib, f"rw_masks_{sfx}")(R, n, L, K, _ptr(tok8), _ptr(out), threads(R)) == 0 else None

    return _per_tensor(_masks_cache, (id(tokens), sfx, K), tokens, build)


_blocks_cache: dict[tuple, tuple] = {}


def _lanes_last(x: torch.Tensor, lanes: int) -> torch.Tensor:
    """(R, n, C) → (R, ⌈n/lanes⌉, C, lanes), samples padded with zeros: a block of samples is one vector per
    column, the layout of the kernel's lanes."""
    R, n, C = x.shape
    nblk = -(-n // lanes)
    padded = torch.zeros(R, nblk * lanes, C, dtype=x.dtype)
    padded[:, :n] = x
    return padded.reshape(R, nblk, lanes, C).transpose(2, 3).contiguous()


def _by_block(tokens: torch.Tensor, tok8: torch.Tensor, lanes: int) -> torch.Tensor:
    """The tokens as tT[r][blk][j][lane] (sample blk·lanes + lane, padded with token 0), built once per token
    tensor: the evaluation's histogram pass reads a block's tokens at position j as one vector."""
    return _per_tensor(_blocks_cache, (id(tokens), lanes), tokens, lambda: _lanes_last(tok8, lanes))


def _p_by_block(P: torch.Tensor, lanes: int, dtype) -> tuple[torch.Tensor, int]:
    """What the evaluation needs of the true conditionals, built once per data set and laid out for vector
    loads, [r][blk][row][lane]: rows P_0 … P_{K−1}, Σ_k P log P (over P > 0), 1/‖P‖, then each sample's
    support as S pairs of rows (k, P_k), k ascending, padded with (0, 0). S is the largest support (a
    random walk's rows have two nonzeros): the KL then takes S logarithms a sample, not 2K."""

    def build() -> tuple[torch.Tensor, int]:
        K = P.shape[2]
        Pd = P.detach().to(dtype)
        positive = Pd > 0
        S = max(int(positive.sum(2).max()) if Pd.numel() else 1, 1)
        # support indices, k ascending: sort the keys k (P > 0) or K + k (P = 0)
        order = torch.argsort(torch.where(positive, 0, K) + torch.arange(K), dim=2)[..., :S]
        Psel = Pd.gather(2, order)
        rows = torch.empty(*P.shape[:2], K + 2 + 2 * S, dtype=dtype)
        rows[..., :K] = Pd
        rows[..., K] = torch.where(positive, Pd * torch.log(Pd.clamp_min(torch.finfo(dtype).tiny)), 0.0).sum(2)
        rows[..., K + 1] = 1 / Pd.norm(dim=2)
        rows[..., K + 2::2] = torch.where(Psel > 0, order, 0).to(dtype)
        rows[..., K + 3::2] = Psel
        return _lanes_last(rows, lanes), S

    return _per_tensor(_blocks_cache, (id(P), lanes, dtype), P, build)


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _vec(x: torch.Tensor, R: int, dtype) -> torch.Tensor:
    return x.detach().to(dtype).reshape(R).contiguous()


def train_steps(state: engine.State, data: engine.Batch, lr: torch.Tensor, eps: torch.Tensor, w: torch.Tensor,
                geo: Geometry, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` GD steps on every run, in place (V is replaced by a new tensor, as engine.train_step does).

    Returns (loss, bad): loss (R, steps) is each run's training loss before each step; bad (R,) int64 is
    the first step t whose loss or updated parameters are not all finite, or −1 (what training.train's
    divergence check needs when it hands the kernel several steps at once)."""
    lib = _kernel_for(state, data, geo)
    if lib is None:
        return _train_steps_torch(state, data, lr, eps, w, geo, steps)
    V0 = state.params["V"]
    dtype = V0.dtype
    R, K = V0.shape[0], V0.shape[2]
    n, L = data.tokens.shape[1], data.tokens.shape[2]
    tok, y = _as_bytes(data.tokens, K), _as_bytes(data.y, K)
    V = V0.detach().to(dtype).contiguous().clone()
    a = state.a if state.a.is_contiguous() and state.a.dtype == dtype else state.a.detach().to(dtype).contiguous()
    c = state.c if state.c.is_contiguous() and state.c.dtype == dtype else state.c.detach().to(dtype).contiguous()
    lr_, eps_, w_ = _vec(lr, R, dtype), _vec(eps, R, dtype), _vec(w, R, dtype)
    loss = torch.empty(R, steps, dtype=dtype)
    bad = torch.empty(R, dtype=torch.int32)
    fn = lib.rw_train_f64 if dtype == torch.float64 else lib.rw_train_f32
    # a call of a few steps reuses cached masks; a long call builds them per run, in cache, for all its steps
    masks = _masks(lib, data.tokens, tok, K, dtype) if steps <= 2 else None
    with torch.no_grad():
        rc = fn(ctypes.byref(TrainArgs(
            R=R, n=n, L=L, K=K, T=steps, tok=_ptr(tok), y=_ptr(y), V=_ptr(V), a=_ptr(a), c=_ptr(c), lr=_ptr(lr_),
            eps=_ptr(eps_), w=_ptr(w_), kappa=float(geo.kappa), pp=float(geo.pp), nu_tok=float(geo.nu_tok),
            nu_pos=float(geo.nu_pos), nu_q=float(geo.nu_q), loss=_ptr(loss), bad_step=_ptr(bad), masks=_ptr(masks),
            nthreads=threads(R), impl=0)))
        if rc != 0:
            raise RuntimeError(f"fused kernel rw_train failed (code {rc})")
        if a is not state.a:
            state.a.copy_(a)
        if c is not state.c:
            state.c.copy_(c)
    state.params["V"] = V
    state.step += steps
    return loss, bad.to(torch.int64)


def _train_steps_torch(state, data, lr, eps, w, geo, steps):
    return engine.run_steps(state, steps, lambda: engine.train_step(state, data, lr, eps, w, geo))


def train_step(state: engine.State, data: engine.Batch, lr: torch.Tensor, eps: torch.Tensor, w: torch.Tensor,
               geo: Geometry, steps: Optional[int] = None) -> torch.Tensor:
    """engine.train_step, fused: one GD step on every run, in place, returning each run's training loss
    before the step (R,). With `steps=T`, T steps in one call (a run's data stay in cache across its
    steps), returning the losses before each step (R, T)."""
    if steps is None:
        if _kernel_for(state, data, geo) is None:
            return engine.train_step(state, data, lr, eps, w, geo)
        return train_steps(state, data, lr, eps, w, geo, 1)[0][:, 0]
    return train_steps(state, data, lr, eps, w, geo, steps)[0]


def evaluate(state: engine.State, data: engine.Batch, eps: torch.Tensor, geo: Geometry,
             PiT: Optional[torch.Tensor] = None, full: bool = True, once: bool = False) -> engine.Probe:
    """engine.evaluate, fused: the forward pass and every metric of engine.Probe. With full=False (a history
    row, not a snapshot) the kernel may skip what only snapshots keep: of the attention only the parent and
    query columns (attention[:, −2:]) are then set, h_example and h_var may be NaN; every other field is
    the same. once=True: a data set evaluated once (the training set's final loss), so the true
    conditionals are read where they lie rather than laid out in blocks first, which pays only over many
    evaluations (half of the 0.65 s cProfile gave its builds on the 1,000-run §5 grid's main thread); the metrics of P (kl, pred_dist) then take the
    kernel's gathered path, within its rounding of the blocked one, and every other field is the same bits."""
    lib = _kernel_for(state, data, geo)
    if lib is None:
        return engine.evaluate(state, data, eps, geo, PiT)
    V = state.params["V"]
    dtype = V.dtype
    R, K = V.shape[0], V.shape[2]
    n, L = data.tokens.shape[1], data.tokens.shape[2]
    tok, y = _as_bytes(data.tokens, K), _as_bytes(data.y, K)
    Vc, a, c = (t.detach().to(dtype).contiguous() for t in (V, state.a, state.c))
    P = data.P_true.detach().to(dtype).contiguous()
    eps_ = _vec(eps, R, dtype)
    out = {k: torch.empty(R, dtype=dtype) for k in ("loss", "acc", "kl", "pred_dist", "spread")}
    att = torch.empty(R, L + 1, dtype=dtype)
    hx, hv = torch.empty(R, K, dtype=dtype), torch.empty(R, K, dtype=dtype)
    pred, gap = torch.empty(R, n, dtype=torch.uint8), torch.empty(R, dtype=dtype)
    fn = lib.rw_eval_f64 if dtype == torch.float64 else lib.rw_eval_f32
    masks = _masks(lib, data.tokens, tok, K, dtype)
    lanes = 8 if dtype == torch.float64 else 16
    blocks = _by_block(data.tokens, tok, lanes) if masks is not None else None
    PB, S = _p_by_block(data.P_true, lanes, dtype) if masks is not None and not once else (None, 0)
    rc = fn(ctypes.byref(EvalArgs(
        R=R, n=n, L=L, K=K, tok=_ptr(tok), y=_ptr(y), P=_ptr(P), V=_ptr(Vc), a=_ptr(a), c=_ptr(c), eps=_ptr(eps_),
        nu_tok=float(geo.nu_tok), nu_pos=float(geo.nu_pos), nu_q=float(geo.nu_q), loss=_ptr(out["loss"]),
        acc=_ptr(out["acc"]), kl=_ptr(out["kl"]), pred_dist=_ptr(out["pred_dist"]), attention=_ptr(att),
        spread=_ptr(out["spread"]), h_example=_ptr(hx), h_var=_ptr(hv), pred=_ptr(pred), gap=_ptr(gap),
        masks=_ptr(masks), tokT=_ptr(blocks),
        full=int(full), PB=_ptr(PB), S=S, nthreads=threads(R), impl=0)))
    if rc != 0:
        raise RuntimeError(f"fused kernel rw_eval failed (code {rc})")
    pred_dist = torch.where(engine.overflowed(state.params), torch.nan, out["pred_dist"])
    return engine.Probe(out["loss"], out["acc"], out["kl"], pred_dist, att, out["spread"], hx, hv,
                        engine.v_pi_cosine(V, PiT), pred, ~(gap > _argmax_tolerance(Vc, K, L)))


def _argmax_tolerance(V: torch.Tensor, K: int, L: int) -> torch.Tensor:
    """(R,) how far this kernel's f may lie from engine.evaluate's, with room: a sample whose top-2 gap of f is
    above it has the same argmax in both. Both compute α, β, β_q from the same stabilised logits (bit for bit
    up to exp, ≤ 2 ulp each), H as a sum of L positive terms, Z of K + 1 more, h = α∘H/Z and f = V h in their
    own orders. In the normal range each f_o is within (2K + 2L + 16)·ε·Σ_i |V_oi| h_i of the real number
    (Σ_i h_i ≤ 1); the kernel leaves a sample whose Z is below √tiny to engine (its `gap` is 0 there), so the
    absolute roundings of subnormal α, β, H add at most ε·√tiny per term of h; and a product or sum in f that
    underflows is off by at most half the least subnormal, K + 1 of them per f_o. Eight times the relative
    bound of both, plus eight times the absolute one; where a sample is closer to a tie than this, the
    prediction check asks engine's exact pass (`training._Log.predictions`)."""
    fi = torch.finfo(V.dtype)
    least = fi.tiny * fi.eps  # the least subnormal
    return 16 * (2 * K + 2 * L + 16) * fi.eps * V.abs().sum(2).amax(1) + 8 * (K + 1) * least
