"""cluster=ray against a real `ray start --head` (token authentication on, as Ray's default
is), started and stopped by the test: a micro sweep end to end with the project shipped through
Ray's runtime_env, and a driver without the token refused in one line."""
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jobs.launch import free_port

RAY = str(Path(sys.executable).with_name("ray"))
CLI = [sys.executable, "-m", "orchestrator", "sweep", "size=micro", "family=dense", "seed=0",
       "tracker=none", "eval.jobs=[regbench]", "cluster=ray"]


@pytest.fixture(scope="module")
def head():
    """A one-node cluster with 2 CPUs and a fake GPU; its own port, temp dir and token."""
    token, port = secrets.token_hex(32), free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths are limited
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--num-cpus=2", "--num-gpus=1", f"--memory={3 * 2**30}", f"--object-store-memory={100 * 2**20}",
         "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([RAY, "status", f"--address={address}"], env=env,
                             capture_output=True).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "ray head did not come up"
            time.sleep(1)
        yield address, env, Path(temp)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # never `ray stop`: it stops every Ray of the user
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def test_micro_sweep_on_an_existing_cluster_with_the_project_shipped(head, tmp_path):
    address, env, temp = head
    # A relative store root: the tasks run in the shipped working_dir, not in this directory.
    done = subprocess.run([*CLI, f"cluster.address={address}", "cluster.ship_code=true",
                           "store.root=store", "--name", "onray"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    store = tmp_path / "store"
    [run] = list((store / "runs").iterdir())
    state = (run / "state.json").read_text()
    assert '"status": "done"' in state and "regbench" in state
    assert (store / "sweeps" / "onray" / "report.md").exists()
    shipped = list(temp.glob("session_*/runtime_resources/working_dir_files/*/orchestrator/executors/ray_driver.py"))
    assert shipped, "the project was not shipped with the runtime_env"
    assert not list(temp.glob("session_*/runtime_resources/working_dir_files/*/.venv"))


def test_a_driver_without_the_token_is_refused_in_one_line(head, tmp_path):
    address, env, _ = head
    env = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    refused = subprocess.run([*CLI, f"cluster.address={address}", f"store.root={tmp_path / 's'}"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    line = [s for s in refused.stderr.splitlines() if s.startswith("error:")]
    assert line and "RAY_AUTH_TOKEN" in line[0], refused.stdout + refused.stderr


def test_cluster_ray_needs_an_address():
    out = subprocess.run([*CLI, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cluster.address: cluster=ray needs the address" in out.stderr


def test_an_address_that_is_not_a_ray_head_is_refused_within_the_timeout(tmp_path):
    """Something listens, but not Ray: Ray would retry for ever with a warning a second; the
    sweep stops after cluster.connect_timeout_s with one line naming the address."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        refused = subprocess.run([*CLI, f"cluster.address={address}", "cluster.connect_timeout_s=3",
                                  f"store.root={tmp_path / 's'}"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert time.monotonic() - started < 60
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"error: cluster.address={address}: ") and "ray start --head" in line, line
