"""cluster=ray: an existing Ray cluster (`ray start --head` on its first node, `ray start
--address=...` on the others) at cluster.address. With token authentication on (Ray's default),
export the cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) before the
sweep, as on every node. Where the nodes do not share this machine's files, the project is
shipped to them with Ray's runtime_env."""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from common.settings import require, setting
from orchestrator.executors import CLUSTERS, ClusterConfig
from orchestrator.executors.ray_driver import RAY_OPTIONS, RayExecutor
from orchestrator.plan import PlannedRun
from orchestrator.store import Store
from orchestrator.worker import PROJECT_ROOT

# Never shipped to a cluster with the project (runtime_env working_dir).
SHIP_EXCLUDES = [".venv", ".git", "outputs", "wandb", "**/__pycache__", "*.egg-info",
                 ".pytest_cache", "*.pt", "*.parquet"]


class RayClusterExecutor(RayExecutor):
    config: "RayClusterConfig"

    def check(self, runs: list[PlannedRun], name: str, store: Store) -> None:
        """An address where nothing listens is refused by the dry run too, before anything is
        written (auto: the address of the cluster started here, read from Ray's files)."""
        super().check(runs, name, store)
        address, timeout = self.config.address, self.config.connect_timeout_s
        problem = None if address == "auto" else _not_listening(address, timeout)
        if problem:
            raise RuntimeError(f"cluster.address={address}: {problem}; {self._fix()}")

    def _fix(self) -> str:
        return (f"check that `ray start --head` runs there and that this machine reaches it (or raise "
                f"cluster.connect_timeout_s={self.config.connect_timeout_s:g})")

    def connect(self) -> None:
        """ray.init at cluster.address within cluster.connect_timeout_s, or one line naming the
        address: Ray itself retries a head that does not answer for ever, printing a warning
        every few seconds."""
        import ray

        address, timeout = self.config.address, self.config.connect_timeout_s
        kwargs = dict(RAY_OPTIONS)
        if self.config.ships_code():
            kwargs["runtime_env"] = {"working_dir": str(PROJECT_ROOT), "excludes": SHIP_EXCLUDES}
        # Ray's own wait for the head, in seconds, and its C++ warnings on stderr, while it waits.
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(max(1, int(timeout))))
        try:
            with _stderr_silenced():
                _within(timeout, lambda: ray.init(address=address, **kwargs))
        except TimeoutError:
            raise RuntimeError(f"cluster.address={address}: no Ray cluster answered within {timeout:g} s "
                               f"(something listens there, but not Ray's head); {self._fix()}") from None
        except ray.exceptions.AuthenticationError:
            raise RuntimeError(
                f"cluster.address={address}: the Ray cluster refused this driver's token; export the "
                f"cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH), the same "
                f"on every node") from None
        except ConnectionError as e:  # also what a driver without the cluster's token gets
            raise RuntimeError(
                f"cluster.address={address}: cannot connect to Ray ({str(e).strip().splitlines()[0]}); "
                f"check that `ray start --head` runs there and, with token authentication (Ray's "
                f"default), that this shell exports the cluster's RAY_AUTH_MODE=token and "
                f"RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)") from None


def _not_listening(address: str, timeout: float) -> Optional[str]:
    """Why nothing takes a TCP connection at `address` (host:port, or ray://host:port), or None."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except ValueError:
        return "not host:port (e.g. 10.0.0.5:6379, or auto)"
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return f"nothing listening there ({e.strerror or e})"


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """`call()` in a thread, waited for at most `seconds` (TimeoutError then; the thread is left
    to the process's exit); its exception, if any, raised here."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001  handed to the caller
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="ray-connect")
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block: what Ray's C++ core prints there while it
    connects (a warning a second), which Python's logging settings do not reach."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@CLUSTERS.register("ray")
@dataclass
class RayClusterConfig(ClusterConfig):
    address: Optional[str] = setting()     # head-ip:6379, or auto
    ship_code: Optional[bool] = setting()  # null: ship the project unless the address is on this machine
    connect_timeout_s: float = setting(gt=0)  # to reach the head before the sweep is refused

    executor_class = RayClusterExecutor

    def check(self, run: Any) -> None:
        require(bool(self.address), "cluster.address: cluster=ray needs the address of a running cluster, "
                "e.g. cluster.address=10.0.0.5:6379 (or auto for the one started on this machine)")

    def ships_code(self) -> bool:
        """cluster.ship_code, or (null) whether the address is not a cluster on this machine."""
        if self.ship_code is not None:
            return self.ship_code
        if not self.address or self.address == "auto":
            return False
        host = self.address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
        local = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
        try:
            local |= set(socket.gethostbyname_ex(socket.gethostname())[2])
        except OSError:
            pass
        return host not in local
