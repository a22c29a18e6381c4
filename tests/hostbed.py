"""The multi-host test bed (scripts/hosts-*.sh) from the tests: hosts node1..nodeN on this
machine, each with its own network namespace, address, hostname and private /tmp; commands run
"on" a host through scripts/on-host.sh. Needs root (namespaces, bridges, mounts); see
docs-draft/multinode.md.

One bed per test module (`bed_fixture`): brought up once, torn down in a finalizer whatever
happens (scripts/hosts-down.sh kills every process of every host: Ray, Slurm, jobs)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
BIN = Path(sys.executable).parent  # the venv of this interpreter (ray, torchrun, the project)


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return f"== {path}\n" + path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"== {path}: unreadable"


class Bed:
    """N hosts `node1..nodeN` at `<net>.1..N`; `dir` is the bed's directory on the shared
    filesystem (stores go under `dir/shared`)."""

    def __init__(self, name: str, net: str, n: int = 3):
        self.name, self.net, self.n = name, net, n
        self.dir = Path(f"/var/tmp/hosts-{name}")
        self.settings = {"HOSTS_BED": name, "HOSTS_NET": net, "HOSTS_N": str(n),
                         "HOSTS_DIR": str(self.dir)}

    # ---- environment and commands -----------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        """What commands on the hosts get: this venv first on PATH, the checkout importable,
        one thread, no Ray or Slurm settings of the caller, the bed's Ray token if it has one."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_", "SLURM_", "PYTEST_", "HOSTS_"))}
        env.update(self.settings, PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
        token = self.dir / "ray" / "env"
        if token.exists():
            for line in token.read_text().splitlines():
                key, _, value = line.removeprefix("export ").partition("=")
                env[key] = value
        env.update(extra)
        return env

    def script(self, name: str, *args: str, timeout: float = 300, check: bool = True,
               **env: str) -> subprocess.CompletedProcess:
        out = subprocess.run(["bash", str(SCRIPTS / name), *args], env=self.env(**env), cwd=REPO,
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            logs = "\n".join(log_tail(p) for p in sorted((self.dir / "log").glob("*.log")))
            raise AssertionError(f"{name} {' '.join(args)} exited {out.returncode}:\n"
                                 f"{out.stdout}{out.stderr}\n{logs}")
        return out

    def on_command(self, k: int, *cmd: str) -> list[str]:
        return ["bash", str(SCRIPTS / "on-host.sh"), str(k), *cmd]

    def on(self, k: int, *cmd: str, timeout: float = 600, env: Optional[dict] = None,
           cwd: Path = REPO) -> subprocess.CompletedProcess:
        """Run `cmd` on host k and wait for it (output captured)."""
        return subprocess.run(self.on_command(k, *cmd), env=env or self.env(), cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)

    def start_on(self, k: int, *cmd: str, env: Optional[dict] = None, cwd: Path = REPO,
                 output: Optional[Path] = None) -> subprocess.Popen:
        """Start `cmd` on host k, stdout and stderr together: to `output` (a file, for a
        process that may print more than a pipe holds while nobody reads it), else a pipe."""
        out = open(output, "w") if output else subprocess.PIPE
        try:
            return subprocess.Popen(self.on_command(k, *cmd), env=env or self.env(), cwd=cwd,
                                    stdout=out, stderr=subprocess.STDOUT, text=True)
        finally:
            if output:
                out.close()

    def python_on(self, k: int, code: str, timeout: float = 120) -> str:
        out = self.on(k, sys.executable, "-c", code, timeout=timeout)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    # ---- the bed ----------------------------------------------------------------------------
    def up(self) -> None:
        self.script("hosts-up.sh")

    def down(self) -> None:
        self.script("hosts-down.sh", check=False, timeout=120)

    def shared(self, name: str) -> Path:
        """A fresh directory every host sees (a store root)."""
        path = self.dir / "shared" / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def addr(self, k: int) -> str:
        return f"{self.net}.{k}"

    def pids(self, k: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", f"{self.name}-node{k}"], capture_output=True,
                             text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, k: int) -> int:
        """SIGKILL every process of host k at once (its raylet, its Ray workers, its ranks, its
        daemons): the host is as good as powered off, its network namespace stays."""
        killed = 0
        for _ in range(10):  # processes forked while we kill: again until none is left
            pids = self.pids(k)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        return killed

    def link(self, k: int, up: bool) -> None:
        """Host k's cable: its port on the bridge down (or up again)."""
        subprocess.run(["ip", "-n", f"{self.name}-br", "link", "set", f"h{k}",
                        "up" if up else "down"], check=True)

    # ---- Ray --------------------------------------------------------------------------------
    def ray_up(self, **env: str) -> str:
        self.script("hosts-ray-up.sh", timeout=400, **env)
        return self.ray_address

    @property
    def ray_address(self) -> str:
        return (self.dir / "ray" / "address").read_text().strip()

    def ray_nodes(self) -> dict[str, dict]:
        """Ray's view of the nodes, from a driver on node1: node id -> host name, address, alive."""
        code = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False);"
                "print(json.dumps({n['NodeID']: {'host': n['NodeName'], 'ip': n['NodeManagerAddress'],"
                " 'alive': n['Alive']} for n in ray.nodes()}))" % self.ray_address)
        return json.loads(self.python_on(1, code).strip().splitlines()[-1])


def bed_fixture(request, name: str, net: str, n: int = 3) -> Bed:
    """Bring a bed up for a test module, torn down by a finalizer registered first."""
    if os.geteuid() != 0:
        pytest.skip("the multi-host test bed needs root (network namespaces, bridges, mounts)")
    bed = Bed(name, net, n)
    request.addfinalizer(bed.down)
    bed.up()
    return bed
