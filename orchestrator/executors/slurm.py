"""cluster=slurm: one Slurm allocation per submission. Its script starts a Ray head on the first
node and Ray workers on the others (`srun`), then runs the same sweep driver inside it as a
`cluster=ray` sweep against that Ray. The store on the shared filesystem is what the allocation
reads and writes, so a cancelled, pre-empted or timed-out allocation resubmitted (`--requeue`,
or the same `sweep` again) resumes where it stopped: finished jobs are skipped, interrupted ones
resume from their checkpoints. `status` shows its Slurm state, `cancel` scancels it."""
from __future__ import annotations

import shlex

from config.cluster import SlurmConfig
from orchestrator.executors import EXECUTORS
from orchestrator.executors.slurm_tools import (Request, SlurmExecutor, header, prologue, quoted,
                                                slurm_dir)
from orchestrator.plan import PlannedRun, check_fit
from store.store import Store

# Ray's nodes that are up, counted from `ray status`: the node lines of its Active (and, in Ray's
# newer autoscaler, Idle) sections. Its "Recent failures" section names dead nodes too, so a plain
# count of node lines would count a node that died and is rejoining as already there.
ALIVE_NODES_AWK = "/^(Active|Idle):/ {on = 1; next} /^[^ ]/ {on = 0} on && $2 ~ /^node_/ {n += $1} END {print n + 0}"


def inner_overrides(overrides: list[str]) -> list[str]:
    """The user's overrides minus the cluster ones: inside the allocation the cluster is Ray."""
    def key(o: str) -> str:
        return o.split("=", 1)[0].lstrip("+~")
    return [o for o in overrides if key(o) != "cluster" and not key(o).startswith("cluster.")]


@EXECUTORS.register("slurm")
class SlurmAllocationExecutor(SlurmExecutor):
    config: SlurmConfig

    def check(self, runs: list[PlannedRun], name: str, store: Store) -> None:
        super().check(runs, name, store)
        check_fit([r for r in runs if r.todo], self.allocation_nodes())  # refused now, not after the queue

    def allocation_nodes(self) -> list[dict[str, float]]:
        """The Ray nodes the allocation will start, in Ray's resource names (as the script sizes them)."""
        c = self.config
        node = {"CPU": c.cpus_per_node, "GPU": c.gpus_per_node, "memory": int(c.mem_gb * 2**30 * 3 / 4)}
        return [dict(node) for _ in range(c.nodes)]

    def scripts(self, runs: list[PlannedRun], name: str, overrides: list[str], store: Store) -> dict[str, str]:
        return {"allocation": self.render(name, overrides, store)}

    def request(self, runs: list[PlannedRun]) -> Request:
        c = self.config
        return Request(c.nodes, c.cpus_per_node, c.mem_gb, c.gpus_per_node,
                       {"nodes": "cluster.nodes", "cpus": "cluster.cpus_per_node", "mem_gb": "cluster.mem_gb",
                        "gpus": "cluster.gpus_per_node"})

    def render(self, name: str, overrides: list[str], store: Store) -> str:
        """Ray head on the first node, workers on the others, the driver on the head.

        Ray's token authentication (on by default) needs the same RAY_AUTH_MODE/RAY_AUTH_TOKEN on
        every node and in the driver: a fresh token per allocation, exported before `srun`,
        reaches them all. Ray waits for ever on a request no node can satisfy; the driver's
        `check_fit` refuses those against the allocation's live nodes."""
        cl = self.config
        out = slurm_dir(store, name)
        driver = ["python", "-m", "orchestrator", "sweep", *inner_overrides(overrides), "cluster=ray",
                  "cluster.ship_code=false"]
        gpus = cl.gpus_per_node
        return "\n".join([
            "#!/bin/bash",
            f"# Sweep {name} on Slurm (cluster=slurm), rendered by `python -m orchestrator sweep`.",
            *header(cl, f"sweep-{name}", out / "%j.out", cl.cpus_per_node, cl.mem_gb, gpus, cl.nodes),
            *prologue(cl),
            "",
            "# One Ray cluster per allocation: its own port, temp dir and token.",
            "export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token",
            "RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')",
            "export RAY_AUTH_TOKEN",
            'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            'HEAD=${NODES[0]}',
            'HEAD_IP=$(srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" hostname --ip-address | awk \'{print $1}\')',
            "# Ray moves a loopback --node-ip-address to the primary interface unless told to stay.",
            'case $HEAD_IP in 127.*) export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ;; esac',
            'PORT=$((20000 + SLURM_JOB_ID % 20000))',
            'export RAY_ADDRESS=$HEAD_IP:$PORT',
            'MEM=$((SLURM_MEM_PER_NODE * 1024 * 1024))',
            f'RAY_ARGS=(--block --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus={gpus} '
            '--memory=$((MEM * 3 / 4)) --object-store-memory=$((MEM / 4)) --disable-usage-stats)',
            'PIDS=()',
            "# Never `ray stop` here: it would stop every Ray of this user on the node.",
            'stop_ray() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }',
            'trap stop_ray EXIT',
            f'ray_nodes() {{ ray status --address="$RAY_ADDRESS" 2>/dev/null | awk {shlex.quote(ALIVE_NODES_AWK)}; }}',
            'wait_nodes() {',
            f'  for _ in $(seq {int(cl.ray_start_timeout_s)}); do',
            '    [ "$(ray_nodes)" -ge "$1" ] && return 0; sleep 1',
            '  done',
            '  echo "Ray: fewer than $1 nodes joined" >&2; return 1',
            '}',
            'srun --nodes=1 --ntasks=1 --overlap -w "$HEAD" ray start --head --node-ip-address="$HEAD_IP" '
            '--port="$PORT" --temp-dir="/tmp/ray-$SLURM_JOB_ID" --include-dashboard=false "${RAY_ARGS[@]}" &',
            'PIDS+=($!)',
            'wait_nodes 1',
            'if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then',
            '  srun --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks=$((SLURM_JOB_NUM_NODES - 1)) '
            '--ntasks-per-node=1 --overlap --exclude="$HEAD" ray start --address="$RAY_ADDRESS" '
            '"${RAY_ARGS[@]}" &',
            '  PIDS+=($!)',
            '  wait_nodes "$SLURM_JOB_NUM_NODES"',
            'fi',
            "",
            "# The same sweep driver, against this allocation's Ray; it resumes what is not done.",
            f'{quoted(driver)} "cluster.address=$RAY_ADDRESS" --name {shlex.quote(name)}',
            "",
        ])
