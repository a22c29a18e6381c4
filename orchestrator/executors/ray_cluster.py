"""cluster=ray: an existing Ray cluster (`ray start --head` on its first node, `ray start
--address=...` on the others) at cluster.address. With token authentication on (Ray's default),
export the cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) before the
sweep, as on every node. Where the nodes do not share this machine's files, the project is
shipped to them with Ray's runtime_env."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Optional

from config.cluster import RayClusterConfig
from orchestrator.executors import EXECUTORS
from orchestrator.executors.ray_driver import RAY_OPTIONS, RayExecutor
from orchestrator.plan import PlannedRun
from store.store import Store
from orchestrator.worker import PROJECT_ROOT

# Never shipped to a cluster with the project (runtime_env working_dir).
SHIP_EXCLUDES = [".venv", ".git", "outputs", "wandb", "**/__pycache__", "*.egg-info",
                 ".pytest_cache", "*.pt", "*.parquet"]


@EXECUTORS.register("ray")
class RayClusterExecutor(RayExecutor):
    config: RayClusterConfig

    def check(self, runs: list[PlannedRun], name: str, store: Store) -> None:
        """An address where nothing listens is refused by the dry run too, before anything is
        written (auto: the address of the cluster started here, read from Ray's files)."""
        super().check(runs, name, store)
        address, timeout = self._address(), self.config.connect_timeout_s
        problem = None if address == "auto" else _not_listening(address, timeout)
        if problem:
            raise RuntimeError(f"cluster.address={address}: {problem}; {self._fix()}")

    def _address(self) -> str:
        """cluster.address: validating the config refused a run without one (RayClusterConfig.check)."""
        assert self.config.address is not None, "cluster=ray needs cluster.address"
        return self.config.address

    def _fix(self) -> str:
        return (f"check that `ray start --head` runs there and that this machine reaches it (or raise "
                f"cluster.connect_timeout_s={self.config.connect_timeout_s:g})")

    def connect(self) -> None:
        """ray.init at cluster.address, once a child process joined the cluster within
        cluster.connect_timeout_s; else one line naming the address. Ray retries a head that
        does not answer for ever, printing a warning a second, and cannot be interrupted while it
        waits: the child can be killed, and its output (those warnings) is dropped."""
        import ray

        address, timeout = self._address(), self.config.connect_timeout_s
        problem = _join_problem(address, timeout)
        if problem == TIMED_OUT:
            raise RuntimeError(f"cluster.address={address}: no Ray cluster answered within {timeout:g} s; "
                               f"{self._fix()}")
        if problem and "AuthenticationError" not in problem:
            raise RuntimeError(
                f"cluster.address={address}: cannot connect to Ray ({problem}); check that `ray start "
                f"--head` runs there and, with token authentication (Ray's default), that this shell "
                f"exports the cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)")
        kwargs = dict(RAY_OPTIONS)
        if ships_code(self.config):
            kwargs["runtime_env"] = {"working_dir": str(PROJECT_ROOT), "excludes": SHIP_EXCLUDES}
        try:
            ray.init(address=address, **kwargs)
        except ray.exceptions.AuthenticationError:
            raise RuntimeError(
                f"cluster.address={address}: the Ray cluster refused this driver's token; export the "
                f"cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH), the same "
                f"on every node") from None


TIMED_OUT = "timed out"
# A driver that joins the cluster and leaves; its last line on failure is the exception.
JOIN = ("import sys, ray\n"
        "try:\n"
        "    ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR')\n"
        "except Exception as e:\n"
        "    sys.exit(f'{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else \"\"}')\n"
        "ray.shutdown()\n")


def _join_problem(address: str, timeout: float) -> Optional[str]:
    """Why a driver could not join the cluster at `address` within `timeout` seconds (TIMED_OUT,
    or the exception's line), or None."""
    # Ray's own wait for the head (a second per try), short of ours: a head that answers but
    # refuses (no token) gets Ray's error, not our timeout.
    env = {**os.environ, "RAY_gcs_server_port_wait_time_s": str(max(1, int(timeout * 2 / 3)))}
    try:
        done = subprocess.run([sys.executable, "-c", JOIN, address], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return TIMED_OUT
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def _not_listening(address: str, timeout: float) -> Optional[str]:
    """Why nothing takes a TCP connection at `address` (host:port, or ray://host:port, as the
    config's check requires), or None."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return f"nothing listening there ({e.strerror or e})"


def ships_code(config: RayClusterConfig) -> bool:
    """cluster.ship_code, or (null) whether the address is not a cluster on this machine."""
    if config.ship_code is not None:
        return config.ship_code
    if not config.address or config.address == "auto":
        return False
    host = config.address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    local = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        local |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return host not in local
