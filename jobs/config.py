"""The typed config a job receives: the sections that decide what it computes, each owned by
its component (the family, model, training recipe, data, evaluations, resources, backend).

The orchestrator's run config extends it with where and how runs happen (cluster, store,
tracker, adaptive seeding; orchestrator/config.py). A job never sees those."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from common.settings import from_dict, section, setting
from jobs.backends import BACKENDS, BackendConfig
from jobs.data import DATA_KINDS, DataConfig
from jobs.evals import EvalSection, eval_config
from jobs.families import FAMILIES, FamilyConfig
from jobs.model import ModelConfig
from jobs.optim import TrainConfig
from jobs.resources import TrainResources


@dataclass
class JobConfig:
    seed: int = setting(ge=0, what="a non-negative integer")
    family: FamilyConfig = section(FamilyConfig)
    model: ModelConfig = section(ModelConfig)
    train: TrainConfig = section(TrainConfig)
    data: DataConfig = section(DataConfig)
    eval: EvalSection = section(EvalSection)
    resources: TrainResources = section(TrainResources)
    backend: BackendConfig = section(BackendConfig)

    @classmethod
    def section_types(cls, raw: Any) -> dict[str, type]:
        """The class of each section whose class depends on a choice in `raw` (the composed
        config, a DictConfig or a dict): family by name, data by kind, backend by name."""
        return {"family": FAMILIES[choice(raw, "family.name")], "data": DATA_KINDS[choice(raw, "data.kind")],
                "backend": BACKENDS[choice(raw, "backend.name")], "eval": eval_config()}


def choice(raw: Any, key: str) -> str:
    """The value of dotted `key` in a composed config (DictConfig) or a plain dict."""
    return str(OmegaConf.select(raw if OmegaConf.is_config(raw) else OmegaConf.create(raw), key))


def job_dict(config: JobConfig) -> dict[str, Any]:
    """The job's sections of a config (a run config holds more) as a plain dict."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(JobConfig)}


def load_job_config(raw: dict[str, Any]) -> JobConfig:
    """The typed job config of `job_dict`'s output (what a torchrun rank reads)."""
    return from_dict(JobConfig, raw)


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
