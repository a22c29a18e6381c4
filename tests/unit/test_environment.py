"""What a job records of the environment it computes in (jobs/environment.py, store/records.py
`Environment`), the store's environment.json, and `train.cpu_capability`, which pins torch's CPU
kernels without changing the run id."""
import json
import os
import platform

import numpy
import pytest
import torch

from analysis.load import NOT_RECORDED, environment_text
from common.settings import ConfigError
from jobs import environment
from orchestrator.config import compose_run, hydra_session
from orchestrator.identity import run_id
from store.records import environment_id
from store.store import Store


def test_current_names_the_versions_the_kernels_and_the_threads_of_this_process():
    env = environment.current(threads=3, processes=2)
    assert env["torch"] == torch.__version__ and env["numpy"] == numpy.__version__
    assert env["python"] == platform.python_version()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["threads"] == 3 and env["processes"] == 2 and env["device"] == "cpu"
    assert env["torch_build"] == (f"cuda {torch.version.cuda}" if torch.version.cuda else env["torch_build"])
    assert env["deterministic"] is torch.are_deterministic_algorithms_enabled()
    assert environment.current()["threads"] == torch.get_num_threads()
    json.dumps(env)  # a record: plain JSON
    env_id, recorded = environment.recorded(threads=3, processes=2)
    assert recorded == env and env_id == environment_id(env)
    assert environment.recorded(threads=3, processes=2)[1] is recorded  # made once per process and setting
    assert environment.recorded(threads=4, processes=2)[0] != env_id


def test_cpu_model_reads_the_first_model_name(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC 9654\n")
    assert environment.cpu_model(str(cpuinfo)) == "AMD EPYC 9654"
    assert environment.cpu_model(str(tmp_path / "absent")) == (platform.processor() or None)


def test_a_job_pinned_to_kernels_this_process_does_not_run_is_refused():
    actual = torch.backends.cpu.get_cpu_capability()
    other = "default" if actual != "DEFAULT" else "avx2"
    environment.check_capability(None)
    environment.check_capability(actual.lower())
    with pytest.raises(RuntimeError, match=f"train.cpu_capability={other}: torch runs its {actual} CPU kernels"):
        environment.check_capability(other)


def test_cpu_capability_is_outside_the_run_id_and_checked_against_what_torch_reads():
    overrides = ["size=micro", "family=dense", "seed=0"]
    with hydra_session():
        native = compose_run(overrides)
        pinned = compose_run([*overrides, "train.cpu_capability=avx2"])
        with pytest.raises(ConfigError, match="train.cpu_capability"):
            compose_run([*overrides, "train.cpu_capability=AVX2"])  # torch reads lower case only
    assert native.train.cpu_capability is None and pinned.train.cpu_capability == "avx2"
    assert run_id(native) == run_id(pinned)
    assert environment.capability_env(None) == {} and environment.capability_env("avx2") == {
        "ATEN_CPU_CAPABILITY": "avx2"}


ENV_A = {"torch": "2.13.0+cpu", "device": "cpu", "cpu_capability": "AVX512", "threads": 1, "processes": 1,
         "deterministic": False, "kernel_env": {}, "hostname": "a"}
ENV_B = {**ENV_A, "cpu_capability": "AVX2", "hostname": "b"}


def test_the_store_keeps_every_environment_of_a_run_once_with_its_first_use(tmp_path, monkeypatch):
    s = Store(tmp_path)
    s.create()
    jobs = ["train", "regbench"]
    writes = []
    real = Store._add_environment
    monkeypatch.setattr(Store, "_add_environment",
                        lambda self, rid, entry: writes.append(entry) or real(self, rid, entry))
    s.start_job("r1", "train", jobs, environment=(environment_id(ENV_A), ENV_A))
    s.end_job("r1", "train", jobs, error="killed")
    s.start_job("r1", "regbench", jobs, environment=(environment_id(ENV_A), ENV_A))  # the same one: not written again
    assert len(writes) == 1
    s.start_job("r1", "train", jobs, environment=(environment_id(ENV_B), ENV_B))  # resumed on another machine
    entries = s.read_environment("r1")
    assert [e["environment"] for e in entries] == [ENV_A, ENV_B]
    assert [e["first_used"]["job"] for e in entries] == ["train", "train"]
    assert [e["first_used"]["attempt"] for e in entries] == [1, 2]
    state = s.read_state("r1")["jobs"]
    assert state["train"]["environment"] == environment_id(ENV_B) == entries[1]["id"]
    assert state["regbench"]["environment"] == environment_id(ENV_A) == entries[0]["id"]
    path = s.run("r1").environment
    assert os.path.basename(path) == "environment.json" and os.path.dirname(path) == s.run("r1").dir

    with open(path, "w") as f:
        f.write('{"environments": [')  # damaged: read as none, replaced by the next new one
    assert s.read_environment("r1") == []
    env_c = {**ENV_A, "threads": 2}
    s.start_job("r1", "regbench", jobs, environment=(environment_id(env_c), env_c))
    assert [e["environment"]["threads"] for e in s.read_environment("r1")] == [2]
    assert Store(tmp_path).read_environment("no-such-run") == []


def test_environment_text_names_what_can_change_the_numbers():
    assert environment_text(ENV_A) == "torch 2.13.0+cpu, CPU AVX512, 1 thread"
    assert environment_text({**ENV_A, "hostname": "elsewhere", "cpu_model": "another"}) == environment_text(ENV_A)
    assert environment_text({**ENV_A, "threads": 4, "processes": 2, "deterministic": True,
                             "kernel_env": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}}) == (
        "torch 2.13.0+cpu, CPU AVX512, 4 threads per process, 2 processes, deterministic algorithms, "
        "MKL_CBWR=COMPATIBLE")
    gpu = {**ENV_A, "torch": "2.13.0+cu128", "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_capability": "9.0",
           "cudnn": {"deterministic": False, "benchmark": False, "allow_tf32": True, "matmul_allow_tf32": True}}
    assert environment_text(gpu) == ("torch 2.13.0+cu128, NVIDIA H100 80GB HBM3 (compute capability 9.0), 1 thread, "
                                      "TF32 matmuls")
    assert NOT_RECORDED == "not recorded"


def test_an_environment_already_in_the_file_keeps_its_first_use(tmp_path):
    """A state rebuilt after damage names no environment; the file's entry is kept, not repeated."""
    s = Store(tmp_path)
    s.create()
    s.start_job("r1", "train", ["train"], environment=(environment_id(ENV_A), ENV_A))
    (first,) = s.read_environment("r1")
    s._write_state("r1", {"run_id": "r1", "status": "pending", "jobs": {}})  # as `recover` rebuilds it
    s.start_job("r1", "train", ["train"], environment=(environment_id(ENV_A), ENV_A))
    assert s.read_environment("r1") == [first]
