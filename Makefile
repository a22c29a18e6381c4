# Two commands on a fresh machine: `make run` (demo sweep) and `make test` (whole suite);
# `make check` (static checks and the unit tier, about a minute) after every change.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
# Where torch comes from. Empty: the default index, whose torch==2.13.0 for Linux is the CUDA build
# (its nvidia-* wheels are gigabytes). The CPU build (about 200 MB), for machines without a GPU:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Only the torch install reads it; every other package comes from the default index.
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

.PHONY: setup run lint check test bench docs lock clean nanotron-env nanotron-lock

setup: $(STAMP)

# torch first, pinned and from TORCH_INDEX: the project's requirements then find it installed.
# The project is installed editable as a path entry (compat): setuptools' default editable finder
# is consulted after sys.path, where a folder of the working directory named like one of our
# packages (a results store at store.root=store, a config/ folder) would shadow it.
EDITABLE := --config-settings editable_mode=compat
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_FROM) $(TORCH)
	$(PY) -m pip install --quiet -c requirements.lock $(EDITABLE) -e '.[test]'
	touch $(STAMP)

run: setup
	$(PY) -m orchestrator sweep family=lidas,looped,dense seed=0,1,2

# The static checks, configured in pyproject.toml: the layers (import-linter's contracts), ruff's
# lint rules and mypy's types.
lint: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# After every change: the static checks and tests/unit (in-process tests, each file a few seconds)
# on two workers. mypy (single-threaded, about 20 s without its cache) runs beside the tests rather
# than before them; the target fails if either does.
check: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy & types=$$!; $(PY) -m pytest -q -n 2 tests/unit; tests=$$?; wait $$types && exit $$tests

# Before pushing: the static checks, the docs, then the whole suite (tests/unit and tests/e2e): four
# workers, whole files each (module fixtures are built once; one file holds the Slurm tests). Most
# tests wait on processes and the disk (Ray start-up, kills, polling, Slurm's scheduler, checkpoint
# writes): on 2 cores the suite keeps about one core busy, so several workers overlap their waits.
# nanotron-env: the side environment for nanotron's own loader and checkpoint code (below).
# The docs site is built --strict, so a broken link, a missing page or a missing include fails
# (never with --quiet, which hides the warnings that --strict counts).
test: lint nanotron-env
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	$(PY) -m pytest -q -n 4 --dist loadfile

# Each benchmark prints its tables and writes them, with the command, date, commit and cores, to
# docs/performance/<script>.md, which docs/performance.md includes.
BENCH_MD := docs/performance
bench: setup
	$(PY) -m pip install --quiet -c requirements.lock $(EDITABLE) -e '.[bench]'
	$(PY) bench/sweep_efficiency.py --markdown $(BENCH_MD)/sweep_efficiency.md
	$(PY) bench/trainer_speed.py --markdown $(BENCH_MD)/trainer_speed.md
	$(PY) bench/analysis_speed.py --markdown $(BENCH_MD)/analysis_speed.md
	$(PY) bench/scale.py --markdown $(BENCH_MD)/scale.md

# The manual (mkdocs.yml, docs/), built into site/ (git-ignored): open site/index.html, no server
# needed (file:// links, offline search); `.venv/bin/mkdocs serve` previews it while editing.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lock:
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(torch)==' > requirements.lock

# nanotron's own config loader and checkpoint code, for the tests (tests/nanotron_side.py): a
# side environment, because nanotron pins numpy<2 and needs import stand-ins for flash_attn,
# triton and grouped_gemm (tests/nanotron_env/stubs), none of which may touch .venv. nanotron
# itself is the wheel of the pinned commit in ../shared/vendor/nanotron (checksummed there).
# Without that wheel this target says how to get it and the nanotron tests skip (fail in CI).
NT_VENV := .venv-nanotron
NT_PY := $(NT_VENV)/bin/python
NT_STAMP := $(NT_VENV)/.installed
NT_REQ := tests/nanotron_env/requirements.in
NT_LOCK := tests/nanotron_env/constraints.txt
NANOTRON_VENDOR ?= ../shared/vendor/nanotron
NT_WHEEL := $(NANOTRON_VENDOR)/nanotron-0.4-py3-none-any.whl
NANOTRON_COMMIT := $(shell sed -n 's/^NANOTRON_COMMIT = "\([0-9a-f]*\)".*/\1/p' jobs/nanotron/schema.py)

nanotron-env:
	@if [ -f $(NT_WHEEL) ]; then $(MAKE) --no-print-directory $(NT_STAMP); else \
	  echo "nanotron-env: no $(NT_WHEEL) (nanotron at the pinned commit); get it: pip wheel --no-deps -w $(NANOTRON_VENDOR) git+https://github.com/huggingface/nanotron@$(NANOTRON_COMMIT)"; fi

$(NT_STAMP): $(NT_REQ) $(NT_LOCK) $(NT_WHEEL)
	if [ -f $(NANOTRON_VENDOR)/SHA256SUMS ]; then cd $(NANOTRON_VENDOR) && sha256sum --quiet -c SHA256SUMS; fi
	test -x $(NT_PY) || $(PYTHON) -m venv $(NT_VENV)
	$(NT_PY) -m pip install --quiet --upgrade pip
	$(NT_PY) -m pip install --quiet $(TORCH_FROM) $(TORCH)
	$(NT_PY) -m pip install --quiet -c $(NT_LOCK) -r $(NT_REQ)
	$(NT_PY) -m pip install --quiet --no-deps --force-reinstall $(NT_WHEEL)
	touch $(NT_STAMP)

nanotron-lock:
	$(NT_PY) -m pip freeze | grep -v -E '^(torch|nanotron)( |==|@)' > $(NT_LOCK).new
	{ sed -n '1,2p' $(NT_LOCK); cat $(NT_LOCK).new; } > $(NT_LOCK).tmp && rm $(NT_LOCK).new && mv $(NT_LOCK).tmp $(NT_LOCK)

clean:
	rm -rf $(VENV) $(NT_VENV) outputs site
