"""backend: which trainer trains a run (conf/backend/*.yaml), by `backend.name`. How it trains
and loads the final model is its behaviour (jobs/backends/, registered under the same name)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional

from common.registry import Registry
from common.settings import require, section, setting

if TYPE_CHECKING:
    from config.run import JobConfig

# nanotron's _attn_implementation values this project renders (backend.nanotron.attn_implementation);
# nanotron also knows ring, ring_flash_triton and llama3_ring_attention (context parallelism, not
# rendered here). Caution: at the pinned commit, Qwen2Attention.forward takes the packed-qkv path
# (_use_qkv_packed, default true; the other branch is commented out) and calls
# flash_attn_varlen_kvpacked_func whatever this says, so sdpa does not make nanotron run without
# flash-attn there (tests/e2e/test_nanotron_checkpoints.py pins this fact).
ATTN_IMPLEMENTATIONS = ("flash_attention_2", "sdpa", "flex_attention")


@dataclass(frozen=True)
class BackendConfig:
    name: str = setting()
    device: str = setting(choices=("auto", "cpu", "cuda"))  # auto: CUDA when the job was given GPUs

    # True: the backend starts torchrun itself (on every node of a multi-node job, with the
    # rendezvous); False: a multi-process job runs this backend's `train` in each torchrun rank.
    launches_ranks: ClassVar[bool] = False
    # True: training reads the run's data section; False: the backend trains on a dataset of its
    # own, so data options of the training set (data.train_sequences) are refused.
    trains_on_data: ClassVar[bool] = True


BACKEND_CONFIGS: Registry[type[BackendConfig]] = Registry("backend", "config.backend", "backend.name")


@BACKEND_CONFIGS.register("torch")
@dataclass(frozen=True)
class TorchBackendConfig(BackendConfig):
    """The built-in PyTorch trainer (jobs/train.py): nothing more to set."""


@dataclass(frozen=True)
class NanotronSettings:
    """backend.nanotron: how a run is laid out and fed on nanotron (conf/backend/nanotron.yaml).
    dp = the job's GPUs / (tp x pp); train.batch_size = dp x micro_batch_size x accumulation."""
    tp: int = setting(ge=1)
    pp: int = setting(ge=1)
    micro_batch_size: int = setting(ge=1)
    dtype: str = setting(choices=("bfloat16", "float32"))
    dataset: Optional[str] = setting()          # a Hugging Face dataset name, or
    dataset_split: str = setting()
    dataset_config: Optional[str] = setting()
    text_column: str = setting()
    tokenized_path: Optional[str] = setting()   # a folder of tokenized shards (nanotron's nanoset)
    token_size_in_bytes: int = setting(choices=(2, 4))
    dummy_data: bool = setting()                # nanotron's random tokens instead (GPU smoke tests)
    tokenizer: str = setting()
    zero_stage: int = setting(choices=(0, 1))
    run_train: str = setting()                  # nanotron's entry script (in its checkout)
    project: str = setting()                    # nanotron's general.project (the tracker's project)
    # nanotron's _attn_implementation in every stage's model_config. At the pinned commit nanotron's
    # Qwen2 attention calls flash-attn whichever is set (jobs/nanotron/schema.py).
    attn_implementation: str = setting(choices=ATTN_IMPLEMENTATIONS)

    def check(self, run: JobConfig) -> None:
        """The nanotron layout and data, before anything is rendered (jobs/nanotron/render.py)."""
        r = run.resources
        require(run.family.name != "looped", "family=looped: nanotron has no weight-shared layers; "
                "use backend=torch (it runs looped models on GPUs with DDP)")
        require(r.gpus >= 1 and float(r.gpus).is_integer(),
                f"resources.gpus={r.gpus:g}: backend=nanotron trains on whole CUDA GPUs only; "
                f"use a GPU size or backend=torch")
        world, tp, pp, mbs = r.world_size, self.tp, self.pp, self.micro_batch_size
        require(world % (tp * pp) == 0, f"backend.nanotron: tp={tp} x pp={pp} must divide the "
                f"{world} GPUs (resources.nodes x resources.gpus); dp is the quotient")
        per_step = world // (tp * pp) * mbs
        require(run.train.batch_size % per_step == 0,
                f"train.batch_size={run.train.batch_size}: must be a multiple of dp "
                f"{world // (tp * pp)} x backend.nanotron.micro_batch_size={mbs}")
        require(self.dummy_data + (self.dataset is not None) + (self.tokenized_path is not None) == 1,
                "backend.nanotron: set exactly one of dataset=<Hugging Face name>, "
                "tokenized_path=<folder of tokenized shards> or dummy_data=true (with the others null)")


@BACKEND_CONFIGS.register("nanotron")
@dataclass(frozen=True)
class NanotronBackendConfig(BackendConfig):
    """nanotron's trainer, stage by stage, launched with torchrun on the job's GPUs (jobs/nanotron/)."""
    nanotron: NanotronSettings = section(NanotronSettings)

    launches_ranks: ClassVar[bool] = True  # it runs torchrun itself, once per stage
    trains_on_data: ClassVar[bool] = False  # backend.nanotron.dataset, not data.*
