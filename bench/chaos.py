"""Chaos soak across hosts (a benchmark, not a test): a sweep of micro runs on a Ray cluster over
the multi-host test bed (scripts/hosts-up.sh, scripts/hosts-ray-up.sh) while a seeded loop kills,
every few seconds while jobs run, one of: a random Ray worker running a job, the raylet of a random worker host
(the host's Ray dies with it; it rejoins a few seconds later), the link of a random worker host
(cut off for --link-down seconds while its processes live on and may finish their jobs on the
shared store; then its Ray restarts), or the sweep's driver (the same command is run again and
resumes). Bounded in faults and time.

First the same sweep runs undisturbed into a store of its own, on the same cluster: the
reference. At the end it prints the faults injected, the jobs retried, the runs finished, and
whether every finished run's metrics and training history equal the reference's bit for bit;
and checks that nothing was lost (every run finished) and nothing trained twice (each run's
history has every step once; a training that was done stays as it was: same end time, same
attempts, same checkpoint files).

    sudo python bench/chaos.py [--families dense,lidas,looped] [--seeds 10] [--steps 80]
                               [--faults 12] [--every 5] [--max-minutes 30] [--seed 0]
                               [--hosts 3] [--kinds worker,worker,raylet,driver,link]
                               [--link-down 40] [--keepalive-ms 5000] [--keep]

Root only (namespaces). Exit status 0 when every check holds, 1 otherwise. The bed is named
`chaos` (198.18.3.0/24) and torn down at the end unless --keep.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import pandas as pd  # noqa: E402

from hostbed import Bed  # noqa: E402  (the tests' handle on the bed: scripts/hosts-*.sh)
from store.store import DONE, Store  # noqa: E402

COMPARED = ("final_loss", "train_flops", "train_tokens", "steps", "final_layers", "n_params")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Sweep:
    """The sweep's driver on node1, run again (the same command) until it exits 0."""

    def __init__(self, bed: Bed, store: Path, overrides: list[str], name: str):
        self.bed, self.store, self.name = bed, store, name
        self.command = [sys.executable, "-m", "orchestrator", "sweep", *overrides, "cluster=ray",
                        f"cluster.address={bed.ray_address}", f"store.root={store}", "--name", name]
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        for old in store.parent.glob(f"{store.name}-driver-*.log"):  # an earlier soak's
            old.unlink()

    def output(self, start: int) -> Path:
        return self.store.parent / f"{self.store.name}-driver-{start}.log"

    def start(self) -> None:
        self.starts += 1
        self.proc = self.bed.start_on(1, *self.command, output=self.output(self.starts))

    def driver_pid(self) -> Optional[int]:
        """The driver's python on node1 (under on-host.sh and nsenter)."""
        for pid in self.bed.pids(1):
            if "-m orchestrator sweep" in cmdline(pid) and f"--name {self.name}" in cmdline(pid):
                return pid
        return None


def run_ids(store: Path, name: str) -> list[str]:
    try:
        return Store(store).read_sweep(name)["run_ids"]
    except Exception:  # not recorded yet (StoreError), or being written
        return []


def train_state(store: Path, rid: str) -> dict:
    return dict(Store(store).read_state(rid).get("jobs", {}).get("train", {}))


def checkpoint_files(store: Path, rid: str) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in Path(Store(store).layout.run(rid).checkpoints).glob("step_*")}


class Chaos:
    """The seeded fault loop; a fault every `every` seconds on average, at most `faults`."""

    def __init__(self, bed: Bed, sweep: Sweep, rng: random.Random, faults: int, every: float,
                 kinds: list[str], link_down_s: float):
        self.bed, self.sweep, self.rng = bed, sweep, rng
        self.left, self.every, self.kinds, self.link_down_s = faults, every, kinds, link_down_s
        self.injected: Counter = Counter()
        self.log: list[str] = []
        self.restarting: set[int] = set()

    def busy_workers(self) -> list[tuple[int, int, str]]:
        """(host, pid, task) of every Ray worker running a job of the sweep."""
        found = []
        for k in range(1, self.bed.n + 1):
            for pid in self.bed.pids(k):
                line = cmdline(pid)
                if line.startswith("ray::") and any(t in line for t in (":train", ":regbench", "execute")):
                    found.append((k, pid, line.split()[0]))
        return found

    def raylet(self, k: int) -> Optional[int]:
        return next((p for p in self.bed.pids(k) if "/raylet/raylet " in cmdline(p)), None)

    def rejoin(self, k: int, after_s: float = 3, link: bool = False) -> None:
        """After a raylet kill (or `link`: a link down): the rest of the host's Ray goes too
        (its link up again first), then the up script starts it again."""
        def later() -> None:
            time.sleep(after_s)
            if link:
                self.bed.link(k, True)
            self.bed.kill_host(k)
            self.bed.script("hosts-ray-up.sh", timeout=400, check=False)
            self.restarting.discard(k)
        self.restarting.add(k)
        threading.Thread(target=later, daemon=True).start()

    def inject(self) -> Optional[str]:
        """One fault, only while jobs run (a fault at a driver still starting up, or on an idle
        cluster, would test nothing but the start-up); None: not now."""
        workers = self.busy_workers()
        if not workers:
            return None
        kinds = list(self.kinds)
        self.rng.shuffle(kinds)
        choice = self.rng.random()  # drawn whatever happens, so the sequence stays seeded
        for kind in kinds:
            if kind == "worker":
                k, pid, task = workers[int(choice * len(workers))]
                os.kill(pid, signal.SIGKILL)
                return f"worker {task} (pid {pid}) on node{k} killed"
            if kind == "raylet":
                hosts = [k for k in range(2, self.bed.n + 1)
                         if k not in self.restarting and self.raylet(k)]
                if hosts:
                    k = hosts[int(choice * len(hosts))]
                    os.kill(self.raylet(k), signal.SIGKILL)
                    self.rejoin(k)
                    return f"raylet of node{k} killed"
            if kind == "link":
                hosts = [k for k in range(2, self.bed.n + 1) if k not in self.restarting]
                if hosts:
                    k = hosts[int(choice * len(hosts))]
                    self.bed.link(k, False)
                    self.rejoin(k, after_s=self.link_down_s, link=True)
                    return f"link of node{k} cut for {self.link_down_s:g} s"
            if kind == "driver" and (pid := self.sweep.driver_pid()):
                os.kill(pid, signal.SIGKILL)
                return f"driver (pid {pid}) killed"
        return None

    def tick(self, now: float, next_at: float) -> float:
        if self.left <= 0 or now < next_at:
            return next_at
        what = self.inject()
        if not what:
            return next_at  # again at the next tick
        self.left -= 1
        self.injected[what.split()[0]] += 1
        self.log.append(what)
        log(f"fault {sum(self.injected.values())}: {what}")
        return now + self.rng.uniform(0.5, 1.5) * self.every


def soak(bed: Bed, sweep: Sweep, chaos: Chaos, deadline: float) -> tuple[bool, dict, list[str]]:
    """Drive the sweep to the end under faults. Returns (finished, done-snapshots, problems)."""
    problems: list[str] = []
    finished_seen: dict[str, dict] = {}  # run id -> its train state and checkpoints when first seen done
    sweep.start()
    next_fault = time.monotonic() + chaos.rng.uniform(0.5, 1.5) * chaos.every
    while time.monotonic() < deadline:
        for rid in run_ids(sweep.store, sweep.name):
            st = train_state(sweep.store, rid)
            if st.get("status") == DONE:
                seen = finished_seen.setdefault(rid, {"ended_at": st["ended_at"], "attempts": st["attempts"],
                                                      "checkpoints": checkpoint_files(sweep.store, rid)})
                if st["ended_at"] != seen["ended_at"] or st["attempts"] != seen["attempts"]:
                    problems.append(f"{rid}: trained again after it was done ({seen} -> {st})")
                    seen.update(ended_at=st["ended_at"], attempts=st["attempts"])
        code = sweep.proc.poll()
        if code is not None:
            if code == 0 and not chaos.restarting:
                return True, finished_seen, problems
            log(f"driver exited with {code}; the same command again")
            while chaos.restarting and time.monotonic() < deadline:
                time.sleep(0.5)  # a host rejoining: let it, or the retries may not fit
            sweep.start()
        next_fault = chaos.tick(time.monotonic(), next_fault)
        time.sleep(0.3)
    return False, finished_seen, problems


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="dense,lidas,looped")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per family (runs = families x seeds)")
    parser.add_argument("--steps", type=int, default=80, help="training steps of each micro run")
    parser.add_argument("--faults", type=int, default=12, help="most faults injected")
    parser.add_argument("--every", type=float, default=5.0, help="mean seconds between faults")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="bound on the chaos phase")
    parser.add_argument("--seed", type=int, default=0, help="seeds the fault loop")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--kinds", default="worker,worker,raylet,driver,link",
                        help="the faults drawn from (a kind twice: twice as likely)")
    parser.add_argument("--link-down", type=float, default=40.0,
                        help="seconds a host's link stays down (then its Ray restarts)")
    parser.add_argument("--keepalive-ms", default="5000",
                        help="Ray's gRPC keepalive on the bed (HOSTS_RAY_KEEPALIVE_MS; '' = Ray's "
                             "defaults, with which a cut-off host fails over only after minutes)")
    parser.add_argument("--keep", action="store_true", help="leave the bed and its Ray up")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/chaos.py: needs root (network namespaces, bridges, mounts)", file=sys.stderr)
        return 2

    overrides = ["size=micro", f"family={args.families}", f"seed={','.join(map(str, range(args.seeds)))}",
                 "tracker=none", "eval.jobs=[regbench]", "eval.regbench.instances=20", f"train.steps={args.steps}",
                 "train.checkpoint_every=20", "train.max_retries=3"]
    bed = Bed("chaos", "198.18.3", args.hosts)
    started = time.monotonic()
    try:
        bed.up()
        bed.ray_up(**({"HOSTS_RAY_KEEPALIVE_MS": args.keepalive_ms} if args.keepalive_ms else {}))
        log(f"bed up: {args.hosts} hosts, Ray head {bed.ray_address} ({time.monotonic() - started:.0f} s)")

        reference = Sweep(bed, bed.shared("reference"), overrides, "chaos")
        t0 = time.monotonic()
        reference.start()
        assert reference.proc.wait() == 0, reference.output(1).read_text()[-3000:]
        ref_ids = run_ids(reference.store, "chaos")
        log(f"reference: {len(ref_ids)} runs undisturbed in {time.monotonic() - t0:.0f} s")

        sweep = Sweep(bed, bed.shared("chaos"), overrides, "chaos")
        chaos = Chaos(bed, sweep, random.Random(args.seed), args.faults, args.every,
                      args.kinds.split(","), args.link_down)
        t0 = time.monotonic()
        finished, seen, problems = soak(bed, sweep, chaos, t0 + args.max_minutes * 60)
        wall = time.monotonic() - t0
    finally:
        if not args.keep:
            bed.down()

    ids = run_ids(sweep.store, "chaos")
    store = Store(sweep.store)
    done = [rid for rid in ids if store.read_state(rid).get("status") == DONE]
    retried = {f"{rid}:{job}": s["attempts"] for rid in ids
               for job, s in store.read_state(rid).get("jobs", {}).items() if s.get("attempts", 0) > 1}
    identical, differ = 0, []
    for rid in done:
        got = store.read_metrics(rid)["metrics"]
        ref = Store(reference.store).read_metrics(rid)["metrics"]
        h = pd.read_parquet(store.layout.run(rid).history)
        hr = pd.read_parquet(Store(reference.store).layout.run(rid).history)
        if {k: got[k] for k in COMPARED} == {k: ref[k] for k in COMPARED} and h.equals(hr):
            identical += 1
        else:
            differ.append(rid)
        if h["step"].tolist() != list(range(5, args.steps + 1, 5)):
            problems.append(f"{rid}: history steps {h['step'].tolist()}")
    for rid, before in seen.items():  # checkpoints of a finished training are never rewritten
        now = checkpoint_files(sweep.store, rid)
        if now != before["checkpoints"]:
            problems.append(f"{rid}: checkpoints changed after it was done")
    lost = sorted(set(ref_ids) - set(done))
    ray_retries = sum(sweep.output(i).read_text(errors="replace").count("so the task will be retried")
                      for i in range(1, sweep.starts + 1) if sweep.output(i).exists())

    print()
    print(f"chaos soak: {len(ids)} micro runs on {args.hosts} hosts, seed {args.seed}, "
          f"{wall:.0f} s under faults ({'finished' if finished else 'NOT finished in time'})")
    print(f"faults injected: {sum(chaos.injected.values())} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(chaos.injected.items())) or 'none'}); "
          f"driver runs: {sweep.starts}")
    print(f"jobs retried: {len(retried)} started again ({sum(a - 1 for a in retried.values())} extra "
          f"attempts in the runs' states); Ray task retries logged by the drivers: {ray_retries}")
    print(f"runs finished: {len(done)} of {len(ids)}; lost: {len(lost)}")
    print(f"metrics and history equal to the undisturbed run's, bit for bit: {identical} of {len(done)}"
          + (f"; differ: {', '.join(differ)}" if differ else ""))
    print(f"trained twice or rewritten after done: {len(problems)}"
          + "".join(f"\n  {p}" for p in problems))
    for line in chaos.log:
        print(f"  fault: {line}")
    ok = finished and not lost and not differ and not problems and len(done) == len(ids)
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
