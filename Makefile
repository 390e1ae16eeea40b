# `make demo`: set up and run the default sweep; `make test`: set up and run every test, on JOBS parallel workers;
# `make test-fast`: the unit layer only (no test that starts a process, none marked slow), for the edit loop.
# TORCH overrides the torch requirement, e.g. TORCH="torch==2.13.0 --index-url <your CUDA index>" on a GPU box.
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0
SWEEP ?= multirun/demo
JOBS  ?= 3   # pytest-xdist workers: on 2 cores, a third overlaps the time tests spend waiting on processes

.PHONY: install compiled demo test test-fast bench clean slurm-up slurm-down

# pip byte-compiles what it installs one file at a time (most of the set-up's minute: torch alone has thousands
# of modules); compileall does the same on every core. Every module a process can import is compiled at install,
# so a process never compiles one itself (nor could it keep one where PYTHONDONTWRITEBYTECODE is set); the
# libraries' own test suites (their `test/` and `tests/` folders: 3,117 of 13,671 files; compiling 21.7 s against 26.8–29.8 s)
# are left out: nothing here imports them
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile $(TORCH)   # first, so the range in pyproject does not pull a CUDA build
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(PY) -c "import compileall, re, sysconfig; p = sysconfig.get_paths()['purelib']; \
		compileall.compile_dir(p, quiet=2, workers=0, rx=re.compile(re.escape(p) + r'/(.+/)?tests?/'))" \
		|| true   # as pip does, a file for another Python (torch ships 3.12-only files) is skipped
	touch $@

install: $(VENV)/.installed

# This repository's own modules are an editable install, which pip never compiles: without this, every process
# (a launch, a job, an analysis) compiles the ~100 it imports again (~0.2 s of CPU). Refreshed before each use
# (compileall writes only what changed); a module edited since is compiled by the process that imports it.
compiled: install
	$(PY) -m compileall -q -j 0 rw_sweeps analysis hydra_plugins tests launch.py > /dev/null

demo: compiled
	$(PY) launch.py -m data.p=0,0.1,0.5,1 init=zero,gaussian hydra.sweep.dir=$(SWEEP)
	$(PY) -m analysis $(SWEEP) --out $(SWEEP)/report
	@echo "report: $(SWEEP)/report/index.html"

test: compiled
	$(PY) -m pytest -n $(JOBS) --dist loadfile

test-fast: compiled
	RW_UNIT_ONLY=1 $(PY) -m pytest -n $(JOBS) --dist loadfile -m "not e2e and not slurm and not slow"

bench: compiled
	$(PY) benchmarks/bench_hydra.py
	$(PY) benchmarks/bench_sweep.py

slurm-up:
	bash .ci/slurm.sh start

slurm-down:
	bash .ci/slurm.sh stop

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
