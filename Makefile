# Two commands on a fresh machine: `make run` (demo sweep) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0

.PHONY: setup run test bench lock clean

setup: $(STAMP)

# torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -c requirements.lock -e '.[test]'
	touch $(STAMP)

run: setup
	$(PY) -m orchestrator sweep family=lidas,looped,dense seed=0,1,2

# Two workers, whole files each (module fixtures are built once; one file holds the Slurm tests):
# most tests wait on processes (Ray start-up, kills, polling), so two overlap well even on 2 cores.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: setup
	$(PY) -m pip install --quiet -c requirements.lock -e '.[bench]'
	$(PY) bench/sweep_efficiency.py
	$(PY) bench/trainer_speed.py

lock:
	$(PY) -m pip freeze --exclude-editable | grep -v -E '^(torch)==' > requirements.lock

clean:
	rm -rf $(VENV) outputs
