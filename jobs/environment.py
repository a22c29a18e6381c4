"""The environment a job computes in, as the run records it (store/records.py `Environment`,
runs/<id>/environment.json), and the CPU kernel path a run may pin (`train.cpu_capability`).

On CPU the same config and seed give bit-identical numbers only with the same torch, the same
kernels and the same thread count: torch picks its vectorised CPU kernels (ATen's "capability":
AVX512, AVX2, DEFAULT, ...) from the machine's instruction set, so machines of different kinds
compute in different orders and differ in the last bits, which training amplifies.

`train.cpu_capability` pins ATen's kernels by the environment variable torch reads for it,
ATEN_CPU_CAPABILITY, set for the job's process before torch computes anything (the executors
start the job's process with it: a Ray task's runtime_env, `run-one`'s own environment);
`check_capability` refuses a job whose process does not run the pinned kernels. The matrix
multiplications are MKL's, whose own code path the variable does not choose (docs/reliability.md)."""
from __future__ import annotations

import functools
import os
import platform
import socket
import sys
from typing import Optional

import torch

from store.records import Environment, environment_id

CAPABILITY_VARIABLE = "ATEN_CPU_CAPABILITY"
# The variables that choose kernels, recorded where set: ATen's CPU path, MKL's code path and
# instruction set, cuBLAS's deterministic workspace, the TF32 override of NVIDIA's libraries.
KERNEL_VARIABLES = (CAPABILITY_VARIABLE, "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "CUBLAS_WORKSPACE_CONFIG",
                    "NVIDIA_TF32_OVERRIDE")


@functools.cache
def _static() -> Environment:
    """What does not change within a process: versions, build, machine, kernel variables."""
    import numpy

    if torch.version.cuda:
        build = f"cuda {torch.version.cuda}"
    elif getattr(torch.version, "hip", None):
        build = f"rocm {torch.version.hip}"
    else:
        build = "cpu"
    # The kernel variables once per process too: torch and MKL read them once, at their first use.
    return {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "torch_build": build, "cpu_model": cpu_model(), "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "kernel_env": {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}}


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> Optional[str]:
    """The CPU's model name (Linux: the first `model name` of /proc/cpuinfo), else what the
    platform says; None where neither says."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "cpu model", "Model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpu(single_process: bool) -> dict:
    """The CUDA device's name and compute capability. A job of several processes runs CUDA in its
    ranks only, so its launching process (this one) does not initialise CUDA: the name then comes
    from the NVIDIA driver's files, without the capability."""
    if single_process:
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return {"gpu": torch.cuda.get_device_name(index), "gpu_capability": f"{major}.{minor}"}
    names = set()
    root = "/proc/driver/nvidia/gpus"
    for bus in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        try:
            with open(os.path.join(root, bus, "information"), encoding="utf-8") as f:
                names |= {line.split(":", 1)[1].strip() for line in f if line.startswith("Model:")}
        except OSError:
            continue
    return {"gpu": " + ".join(sorted(names)) or None, "gpu_capability": None}


def recorded(threads: Optional[int] = None, processes: int = 1, gpu: bool = False) -> tuple[str, Environment]:
    """`current(...)` with its id (store/records.py `environment_id`), as the store records it;
    made once per process and setting (a job's start costs microseconds). Not to be changed."""
    gpu = gpu and torch.cuda.is_available()
    return _recorded(torch.get_num_threads() if threads is None else threads, processes, gpu,
                     torch.are_deterministic_algorithms_enabled())


@functools.lru_cache(maxsize=64)
def _recorded(threads: int, processes: int, gpu: bool, deterministic: bool) -> tuple[str, Environment]:
    env = current(threads, processes, gpu)
    return environment_id(env), env


def current(threads: Optional[int] = None, processes: int = 1, gpu: bool = False) -> Environment:
    """The environment of a job run from this process: `threads` per process (torch's own count
    when None), `processes` its ranks, `gpu` whether it was given a GPU (it computes on one when
    CUDA is available)."""
    gpu = gpu and torch.cuda.is_available()
    env: Environment = {**_static(), "device": "cuda" if gpu else "cpu",
                        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                        "threads": torch.get_num_threads() if threads is None else threads,
                        "processes": processes, "deterministic": torch.are_deterministic_algorithms_enabled()}
    if gpu:
        env.update(_gpu(processes == 1))  # type: ignore[typeddict-item]  # the two GPU fields
        env["cudnn"] = {"deterministic": bool(torch.backends.cudnn.deterministic),
                        "benchmark": bool(torch.backends.cudnn.benchmark),
                        "allow_tf32": bool(torch.backends.cudnn.allow_tf32),
                        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}
    return env


def capability_env(capability: Optional[str]) -> dict[str, str]:
    """The environment variables a job's process starts with to run `train.cpu_capability`'s
    kernels (none when it is null: the machine's own)."""
    return {CAPABILITY_VARIABLE: capability} if capability else {}


def check_capability(capability: Optional[str]) -> None:
    """Refuse to run a job pinned to `capability` in a process that does not run those kernels:
    the machine lacks the instruction set (torch falls back to the best it has), or torch chose its
    kernels before the variable was set (a process started without it)."""
    if not capability:
        return
    actual = torch.backends.cpu.get_cpu_capability()
    if actual.lower() != capability.lower():
        why = (f"{CAPABILITY_VARIABLE} is {os.environ[CAPABILITY_VARIABLE]!r} here, so this machine lacks it"
               if os.environ.get(CAPABILITY_VARIABLE, "").lower() == capability.lower()
               else f"this process was started without {CAPABILITY_VARIABLE}={capability}")
        raise RuntimeError(f"train.cpu_capability={capability}: torch runs its {actual} CPU kernels ({why}); "
                           f"choose a capability every machine of the cluster has (default, avx2), or null")


def restart_with(variables: dict[str, str]) -> None:
    """Replace this process by itself with `variables` set, unless they are set already: how a
    process that runs jobs itself (`run-one`) starts with a job's kernel variables before torch
    computes anything."""
    if all(os.environ.get(k) == v for k, v in variables.items()):
        return
    os.environ.update(variables)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
