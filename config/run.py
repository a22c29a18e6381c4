"""The run config: a job's config (the sections that decide what it computes) plus where and how
the run happens (cluster, store, tracker, adaptive seeding). Hydra composes it from conf/
(orchestrator/config.py); each section is the class its component declares, chosen by name
where a section has kinds."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Optional, TypeVar, Union

from omegaconf import DictConfig, OmegaConf

from common.settings import ConfigError, from_dict, known_part, section, setting
from config.adaptive import AdaptiveConfig
from config.backend import BACKEND_CONFIGS, BackendConfig
from config.cluster import CLUSTER_CONFIGS, ClusterConfig
from config.data import DATA_CONFIGS, DataConfig
from config.evals import EvalSection, eval_config
from config.family import FAMILY_CONFIGS, FamilyConfig
from config.model import ModelConfig
from config.resources import TrainResources
from config.store import StoreConfig
from config.tracker import TrackerConfig
from config.train import TrainConfig

# A config as composed or stored, before it is typed: a DictConfig, or a plain dict of config.yaml.
RawConfig = Union[DictConfig, Mapping[str, object]]


@dataclass(frozen=True)
class JobConfig:
    """What a job receives; it never sees the run config's other sections.

    `seed` seeds everything; `init_seed` and `data_seed` (null: `seed`) split off the model's
    initialisation and the training data's order, so that the spread between runs can be told
    apart by its source (docs/sweeps.md "Seeds"). Evaluations draw their own samples from `seed`."""
    seed: int = setting(ge=0, what="a non-negative integer")
    init_seed: Optional[int] = setting(None, ge=0, what="a non-negative integer, or null for seed")
    data_seed: Optional[int] = setting(None, ge=0, what="a non-negative integer, or null for seed")
    family: FamilyConfig = section(FamilyConfig)
    model: ModelConfig = section(ModelConfig)
    train: TrainConfig = section(TrainConfig)
    data: DataConfig = section(DataConfig)
    eval: EvalSection = section(EvalSection)
    resources: TrainResources = section(TrainResources)
    backend: BackendConfig = section(BackendConfig)

    @property
    def effective_init_seed(self) -> int:
        """The seed of the model's initialisation."""
        return self.seed if self.init_seed is None else self.init_seed

    @property
    def effective_data_seed(self) -> int:
        """The seed of the training data's order (the stream's batches, a fixed set's epochs)."""
        return self.seed if self.data_seed is None else self.data_seed

    @classmethod
    def section_types(cls, raw: RawConfig) -> dict[str, type]:
        """The class of each section whose class depends on a choice in `raw`: family by name,
        data by kind, backend by name; eval by the declared evaluations."""
        return {"family": FAMILY_CONFIGS[choice(raw, "family.name")], "data": DATA_CONFIGS[choice(raw, "data.kind")],
                "backend": BACKEND_CONFIGS[choice(raw, "backend.name")], "eval": eval_config()}


@dataclass(frozen=True)
class RunConfig(JobConfig):
    cluster: ClusterConfig = section(ClusterConfig)
    store: StoreConfig = section(StoreConfig)
    adaptive: AdaptiveConfig = section(AdaptiveConfig)
    tracker: TrackerConfig = section(TrackerConfig)

    @classmethod
    def section_types(cls, raw: RawConfig) -> dict[str, type]:
        return {**super().section_types(raw), "cluster": CLUSTER_CONFIGS[choice(raw, "cluster.name")]}


def choice(raw: RawConfig, key: str) -> str:
    """The value of dotted `key` in a composed config (DictConfig) or a plain dict."""
    return str(OmegaConf.select(raw if isinstance(raw, DictConfig) else OmegaConf.create(dict(raw)), key))


Config = TypeVar("Config", bound=JobConfig)


def with_derived(run: Config) -> Config:
    """`run` with each section's derived values (a family's nulls from the size, the tracker's
    log_every): every section's `derive(run)` returns its own fields' new values, given the run
    read-only, and a derive that changes anything else is refused."""
    for f in dataclasses.fields(run):
        value = getattr(run, f.name)
        if not hasattr(value, "derive"):
            continue
        before = dataclasses.asdict(run)
        try:
            updates = value.derive(run)
        except dataclasses.FrozenInstanceError as e:
            raise ConfigError(f"{f.name}: its derive() assigned a value ({e}); a section's derive returns "
                              f"its own new values and cannot change the config") from None
        changed = sorted(k for k, v in dataclasses.asdict(run).items() if before[k] != v)
        if changed:
            raise ConfigError(f"{f.name}: its derive() changed {', '.join(changed)}; a section's derive "
                              f"returns its own new values and cannot change the config")
        unknown = sorted(set(updates) - {g.name for g in dataclasses.fields(value)})
        if unknown:
            raise ConfigError(f"{f.name}: its derive() returned {', '.join(unknown)}, which are not fields of "
                              f"{f.name}; a section derives its own values only")
        if updates:
            run = dataclasses.replace(run, **{f.name: dataclasses.replace(value, **updates)})
    return run


def job_dict(config: JobConfig) -> dict[str, object]:
    """The job's sections of a config (a run config holds more) as a plain dict."""
    plain = dataclasses.asdict(config)
    return {f.name: plain[f.name] for f in dataclasses.fields(JobConfig)}


def load_job_config(raw: Mapping[str, object]) -> JobConfig:
    """The typed job config of `job_dict`'s output (what a torchrun rank reads)."""
    return from_dict(JobConfig, raw)


def load_run_config(raw: Mapping[str, object]) -> RunConfig:
    """The typed config of a stored config.yaml (a run planned earlier, perhaps by an earlier
    version: keys today's classes do not have, such as format 1's null sections or the tracker's
    former `sweep`, are left out)."""
    return from_dict(RunConfig, known_part(RunConfig, raw))
