"""eval: which evaluations run after training (`eval.jobs`), on what (`eval.resources`), and
one section of settings per evaluation that has them (`eval.<name>`).

An evaluation is declared here (or in a plugin) with `declare_evaluation`: its settings class
and the data kinds it runs on; its job (jobs/evals/, `@evaluation` under the same name) says
what it computes and records."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, TypeVar

from common.registry import Registry
from common.settings import require, section, setting
from config.data import N_SYMBOLS
from config.resources import Resources

if TYPE_CHECKING:
    from config.run import JobConfig

S = TypeVar("S")  # an evaluation's settings class
GSM8K_HUB = "hub"  # the `eval.gsm8k.path` value that reads openai/gsm8k through `datasets`


@dataclass(frozen=True)
class EvalDeclaration:
    """What the config needs to know of an evaluation: the dataclass of its section eval.<name>
    (None: it has no settings) and the data kinds it runs on (empty: any)."""
    settings: Optional[type] = None
    data: tuple[str, ...] = ()


EVAL_CONFIGS: Registry[EvalDeclaration] = Registry("evaluation", "config.evals", "eval.jobs")


def declare_evaluation(name: str, *, data: tuple[str, ...], settings: Optional[type] = None) -> None:
    """Declare evaluation `name`: its settings class and the data kinds it runs on."""
    EVAL_CONFIGS.register(name)(EvalDeclaration(settings, tuple(data)))


@dataclass(frozen=True)
class EvalSection:
    """`eval`: which evaluations run (`jobs`), on what (`resources`), and one section of settings
    per evaluation that has them, added by `eval_config` from the registry."""
    jobs: list[str] = setting()
    resources: Resources = section(Resources)

    def check(self, run: JobConfig) -> None:
        kind = run.data.kind
        for name in self.jobs:
            data = EVAL_CONFIGS[name].data
            require(not data or kind in data,
                    f"eval.jobs: {name} needs data.kind={'/'.join(sorted(data))}, but data={run.data.name} "
                    f"is data.kind={kind}; drop {name} from eval.jobs or choose other data")


@functools.cache
def eval_config() -> type[EvalSection]:
    """The `eval` section's class: EvalSection plus a field per declared evaluation with settings."""
    fields = [(name, declared.settings, field(default_factory=declared.settings))
              for name, declared in EVAL_CONFIGS.items() if declared.settings is not None]
    cls = dataclasses.make_dataclass("EvalConfig", fields, bases=(EvalSection,), frozen=True)
    cls.__module__ = __name__  # pickled by reference, found through the module's __getattr__
    return cls


def eval_settings(section: EvalSection, name: str, settings: type[S]) -> S:
    """eval.<name>, typed: evaluation `name`'s settings, of the class it was declared with
    (`settings`). The section's field for it is added at run time (`eval_config`), so a type
    checker cannot see `cfg.eval.<name>`; this is its typed path."""
    value = getattr(section, name)
    assert isinstance(value, settings), f"eval.{name} is declared with {settings.__name__}, got {type(value).__name__}"
    return value


def __getattr__(name: str) -> type:
    if name == "EvalConfig":
        return eval_config()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class RegBenchSettings:
    """eval.regbench: the held-out instances scored (one per held-out automaton, cycled)."""
    instances: int = setting(gt=0)
    ngram_alpha: float = setting(gt=0)  # add-alpha smoothing of the ngram*_add_* reference rows
    batch_size: int = setting(gt=0)


@dataclass(frozen=True)
class InductionSettings:
    """eval.induction: prefix-matching scores and, for a grown model, ancestry concentration."""
    sequences: int = setting(gt=0)    # repeated random sequences scored
    length: int = setting(ge=1, le=N_SYMBOLS)  # distinct symbols per copy
    top_k: int = setting(gt=0)        # heads counted as "top" (induction_topk_mean, ancestry)
    ancestors_m: int = setting(gt=0)  # ancestry: top-k heads descending from the best m ancestor heads

    def check(self, run: JobConfig) -> None:
        require(2 * self.length + 2 <= run.model.max_seq_len,
                f"eval.induction.length={self.length}: must fit twice (plus 2 separators) in "
                f"model.max_seq_len={run.model.max_seq_len}")


# The head counts eval.ablation.ks may name: a job records only declared metrics, so the graded
# metrics (`ablation_drop_f1_k<k>`, jobs/evals/ablation.py) are declared for this fixed set, doubling.
ABLATION_KS = tuple(2 ** i for i in range(11))  # 1, 2, 4, ..., 1024


@dataclass(frozen=True)
class MechanismSettings:
    """eval.mechanism: the mechanism at every snapshot of training (train.snapshots). Its heads are
    scored on eval.induction's probe, with its top_k and ancestors_m."""
    divergence_batch: int = setting(16, gt=0)  # training-distribution sequences the layers' outputs are compared on


@dataclass(frozen=True)
class AblationSettings:
    """eval.ablation: every fraction in one job (these settings were part of the run id in format 1,
    so a sweep over `fraction` would retrain); `fraction` gives the headline metrics. `ks`, added
    since, is outside the run id (orchestrator/identity.py): changing it reruns this evaluation only."""
    fraction: float = setting(gt=0, le=1)      # headline: the top fraction of head applications ablated
    fractions: list[float] = setting(gt=0, le=1, nonempty=True)  # the curve
    prompts: int = setting(gt=0)               # prompts per few-shot task (jobs/data/fewshot.py)
    reference_batch: int = setting(gt=0)       # training-distribution instances the head means are taken over
    # graded: the top k head applications for each k, with a layer-matched random control; the
    # default is here too so that a config stored before the field existed loads
    ks: list[int] = setting(factory=lambda: [1, 2, 4, 8], choices=ABLATION_KS, nonempty=True)


@dataclass(frozen=True)
class Gsm8kSettings:
    """eval.gsm8k. Problems from `path`: a JSONL file (`{split}` -> train/test), `hub`
    (`openai/gsm8k` through Hugging Face `datasets`), or null: the arith data's own splits."""
    n_shots: int = setting(ge=0)
    shot_seed: int = setting(ge=0, what="a non-negative integer")
    limit: Optional[int] = setting(ge=1)   # the first N test problems; null = all
    max_new_tokens: int = setting(ge=1)
    path: Optional[str] = setting()

    def check(self, run: JobConfig) -> None:
        if self.path == GSM8K_HUB:
            require(importlib.util.find_spec("datasets") is not None,
                    "eval.gsm8k.path=hub: reading openai/gsm8k needs the `datasets` package; install it "
                    "or give a GSM8K JSONL path")
        elif self.path is not None:
            for split in ("train", "test"):
                path = Path(self.path.replace("{split}", split)).expanduser()
                require(path.is_file(), f"eval.gsm8k.path={self.path}: {path} is not a file; give a GSM8K "
                        f"JSONL (use {{split}} for separate train/test files) or null")


declare_evaluation("regbench", data=("regbench",), settings=RegBenchSettings)
declare_evaluation("induction", data=("regbench",), settings=InductionSettings)
declare_evaluation("ablation", data=("regbench",), settings=AblationSettings)
declare_evaluation("mechanism", data=("regbench",), settings=MechanismSettings)
declare_evaluation("gsm8k", data=("arith",), settings=Gsm8kSettings)
declare_evaluation("knowledge", data=("regbench",))  # records nothing on data without data.facts
declare_evaluation("noop", data=())
