"""cluster=ray: an existing Ray cluster (`ray start --head` on its first node, `ray start
--address=...` on the others) at cluster.address. With token authentication on (Ray's default),
export the cluster's RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) before the
sweep, as on every node. Where the nodes do not share this machine's files, the project is
shipped to them with Ray's runtime_env."""
from __future__ import annotations

import socket

from config.cluster import RayClusterConfig
from orchestrator.executors import EXECUTORS
from orchestrator.executors.ray_driver import RAY_OPTIONS, RayExecutor
from orchestrator.worker import PROJECT_ROOT

# Never shipped to a cluster with the project (runtime_env working_dir).
SHIP_EXCLUDES = [".venv", ".git", "outputs", "wandb", "**/__pycache__", "*.egg-info",
                 ".pytest_cache", "*.pt", "*.parquet"]


@EXECUTORS.register("ray")
class RayClusterExecutor(RayExecutor):
    config: RayClusterConfig

    def connect(self) -> None:
        import ray

        address, kwargs = self.config.address, dict(RAY_OPTIONS)
        if ships_code(self.config):
            kwargs["runtime_env"] = {"working_dir": str(PROJECT_ROOT), "excludes": SHIP_EXCLUDES}
        try:
            ray.init(address=address, **kwargs)
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
