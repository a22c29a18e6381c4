"""Security: no secret from the environment in any file a sweep writes, every port a sweep
opens either on 127.0.0.1 or one of Ray's own token-authenticated core servers, and checkpoints
that are never unpickled into arbitrary objects. (Slurm script quoting: tests/e2e/test_slurm.py.)"""
import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CLI, running_train, wait_for

from ray._private.utils import get_dashboard_dependency_error

from jobs.checkpoint import checkpoint_paths, latest_checkpoint, load_checkpoint, save_checkpoint
from orchestrator import grid
from orchestrator.config import ConfigError

PROJECT = Path(__file__).resolve().parents[2]
SECRETS = {  # shaped like the real ones, so redaction by shape is exercised too
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "HF_TOKEN": "hf_QmVyeVNlY3JldFRva2VuRm9yVGVzdHM",
    "GITHUB_TOKEN": "ghp_T3stT0kenThatMustNeverBeWritten00",
    "MY_SERVICE_TOKEN": "plain-service-token-7f3a91",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYTESTKEY",
}
LOOPBACK = {"127.0.0.1", "::1"}


def _listening() -> dict[int, str]:
    """Socket inode -> local IP of every listening TCP socket on the machine."""
    out = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            if width == 8:
                ip = ".".join(str(b) for b in reversed(raw))
            else:  # four little-endian 32-bit words
                words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                groups = b"".join(words).hex()
                ip = "::" if groups == "0" * 32 else ("::1" if groups == "0" * 31 + "1" else groups)
            out[int(fields[9])] = ip
    return out


def _descendants(root_pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(text.rsplit(")", 1)[1].split()[1])
    found, frontier = {root_pid}, [root_pid]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parents.items() if p == pid and c not in found]
        found.update(children)
        frontier += children
    return found


def _ray_core(cmdline: str) -> bool:
    """Ray's own servers, or the sweep's driver (its core worker's gRPC server)."""
    exe = Path(cmdline.split()[0]).name
    return (exe in ("gcs_server", "raylet") or cmdline.startswith("ray::")
            or cmdline.startswith(f"{sys.executable} -m orchestrator sweep"))


def listeners_of(pids: set[int]) -> list[tuple[int, str, str]]:
    """(pid, command line, IP) of every listening socket held by `pids`."""
    sockets, out = _listening(), []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and int(link[8:-1]) in sockets:
                out.append((pid, cmdline, sockets[int(link[8:-1])]))
    return out


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A tracked micro sweep with secrets in its environment, started in an empty working
    directory; the listening sockets of its processes while a job trains."""
    import subprocess

    work = tmp_path_factory.mktemp("work")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= SECRETS | {"WANDB_BASE_URL": "http://127.0.0.1:9"}  # nothing listens there
    driver = subprocess.Popen(
        [*CLI, "sweep", "size=micro", "family=dense", "seed=0", "train.steps=200", "eval.jobs=[regbench]",
         "cluster.num_cpus=1", "store.root=store", "--name", "s"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: running_train(work / "store"), process=driver)
    sockets = listeners_of(_descendants(driver.pid))
    gcs = [pid for pid, cmd, _ in sockets if "gcs_server" in cmd.split()[0]]
    gcs_env = Path(f"/proc/{gcs[0]}/environ").read_bytes().split(b"\0") if gcs else []
    out, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, out
    return work, out, sockets, gcs_env


def test_no_secret_from_the_environment_in_any_file_a_sweep_writes(swept):
    work, out, _, _ = swept
    files = [p for p in work.rglob("*") if p.is_file()]
    assert any("wandb" in p.parts for p in files)  # W&B's offline files are among them
    for path in files:
        data = path.read_bytes()
        for name, secret in SECRETS.items():
            assert secret.encode() not in data, f"{name} in {path}"
    assert not any(secret in out for secret in SECRETS.values())


def test_no_dashboard_and_every_wide_port_is_rays_token_authenticated_core(swept):
    _, _, sockets, gcs_env = swept
    assert sockets and not [s for s in sockets if "dashboard/dashboard.py" in s[1]]  # off by default
    # Ray's core gRPC servers (GCS, raylet, workers, agents) listen on every interface in Ray
    # 2.60 (a 127.0.0.1 node address is rewritten to the machine's); they require Ray's token.
    wide = [(cmd, ip) for _, cmd, ip in sockets if ip not in LOOPBACK]
    assert all(_ray_core(cmd) for cmd, _ in wide), wide
    assert b"RAY_AUTH_MODE=token" in gcs_env


def test_the_dashboard_binds_to_loopback_unless_configured():
    points, _ = grid.expand(["family=dense", "seed=0"])
    assert points[0].config.cluster.dashboard_host == "127.0.0.1"
    if get_dashboard_dependency_error() is not None:  # minimal Ray: refused in one line
        with pytest.raises(ConfigError, match=r"include_dashboard=true: .*ray\[default\]"):
            grid.expand(["family=dense", "seed=0", "cluster.include_dashboard=true"])


def test_every_torch_load_in_the_project_passes_weights_only_true():
    calls = []
    # The project's own sources: what git tracks or would (not the virtual environments beside them).
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=PROJECT, capture_output=True, text=True, check=True).stdout.split()
    sources = [PROJECT / name for name in listed]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load" and getattr(node.func.value, "id", None) == "torch"):
                safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True
                           for k in node.keywords)
                calls.append((f"{path.relative_to(PROJECT)}:{node.lineno}", safe))
    assert calls and all(safe for _, safe in calls), [where for where, safe in calls if not safe]


class Planted:
    """Unpickling this would run code: it touches a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_holding_a_pickled_object_is_refused_and_skipped(tmp_path):
    marker = tmp_path / "code-ran"
    save_checkpoint({"step": 1, "w": torch.ones(2)}, tmp_path)
    planted = save_checkpoint({"step": 2, "w": torch.ones(2), "payload": Planted(marker)}, tmp_path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(planted)
    assert latest_checkpoint(tmp_path)["step"] == 1  # quarantined, the previous one used
    assert [p.name for p in checkpoint_paths(tmp_path)] == ["step_0000001.pt"]
    assert not marker.exists()
