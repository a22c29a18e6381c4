"""nanotron's own code, run for the tests in the side environment `.venv-nanotron`.

`make test` makes that environment once (Makefile target nanotron-env): the wheel of nanotron at the
pinned commit from ../shared/vendor/nanotron, what its config, checkpoint and model modules import,
and import stand-ins for flash_attn, triton and grouped_gemm (tests/nanotron_env/stubs) on the path
of its subprocesses only. The project's own environment never imports nanotron: nanotron pins
numpy<2, and a stand-in `triton` there would break torch.compile.

Where the environment is missing:
- without the wheel (a machine without ../shared), the nanotron tests skip, saying in one line what
  is missing and how to get it; in CI (CI set) they fail instead, because CI always has ../shared
  and a skipped check there would be a check silently switched off;
- with the wheel but no environment (pytest run without make), they fail: run `make nanotron-env`.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from jobs.nanotron.schema import NANOTRON_COMMIT

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-nanotron"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".installed"
VENDOR = Path(os.environ.get("NANOTRON_VENDOR", ROOT.parent / "shared" / "vendor" / "nanotron"))
WHEEL = VENDOR / "nanotron-0.4-py3-none-any.whl"
HERE = ROOT / "tests" / "nanotron_env"
GET_WHEEL = (f"pip wheel --no-deps -w {VENDOR} "
             f"git+https://github.com/huggingface/nanotron@{NANOTRON_COMMIT} && make nanotron-env")


def side_python() -> Path:
    """The side environment's interpreter, or the skip / failure explained above."""
    if STAMP.is_file():
        return PYTHON
    if not WHEEL.is_file():
        message = f"nanotron at the pinned commit is missing ({WHEEL}); get it: {GET_WHEEL}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI always has ../shared: not skipped here)", pytrace=False)
        pytest.skip(message)
    pytest.fail(f"{VENV} is not set up (nanotron's wheel is at {WHEEL}): run `make nanotron-env`",
                pytrace=False)


def run(script: str, payload: Any, timeout: float = 300, env: dict | None = None) -> Any:
    """Run tests/nanotron_env/<script> in the side environment with `payload` as JSON on stdin;
    returns the JSON it prints last. Its stderr is shown when it fails."""
    python = side_python()
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not the project's
    environment.update({"PYTHONNOUSERSITE": "1",
                        "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **(env or {})})
    done = subprocess.run([str(python), str(HERE / script)], input=json.dumps(payload), text=True,
                          capture_output=True, timeout=timeout, env=environment, cwd=ROOT)
    if done.returncode != 0:
        raise AssertionError(f"{script} in {VENV} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
