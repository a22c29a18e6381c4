"""The run config: Hydra composition, a structured schema, and the checks that the schema cannot
express. Everything a bad override can get wrong fails here, as one `ConfigError` line, before any
job starts or any file is written."""
from __future__ import annotations

import copy
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# The config groups; ORCHESTRATOR_CONF_DIR points at another copy (your own groups, or tests).
CONF_DIR = Path(os.environ.get("ORCHESTRATOR_CONF_DIR") or Path(__file__).resolve().parent.parent / "conf")


class ConfigError(ValueError):
    """A user mistake in the config or the overrides; its message is one line with the fix."""


# ---------------------------------------------------------------------------------------------
# Schema. Types and keys are checked by OmegaConf when the composed config is merged into it.

@dataclass
class GrowthConfig:
    block_layers: Optional[int] = None
    initial_blocks: int = 1
    alpha: float = 1.0
    optimizer_state: str = "copy"


@dataclass
class LoopConfig:
    prelude_layers: Optional[int] = None
    block_layers: Optional[int] = None
    loops: Optional[int] = None
    coda_layers: Optional[int] = None


@dataclass
class FamilyConfig:
    name: str = "dense"
    growth: Optional[GrowthConfig] = None
    loop: Optional[LoopConfig] = None


@dataclass
class ModelConfig:
    name: str = "tiny"
    d_model: int = 64
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 4
    d_ff: int = 176
    vocab_size: int = 20
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    block_size: int = 2
    tie_embeddings: bool = True


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    checkpoint_every: int = 250
    log_every: int = 10
    max_retries: int = 2
    compile: bool = False


@dataclass
class ArithDataConfig:
    """data.kind=arith (jobs/data/arith.py): synthetic GSM8K-format word problems."""
    max_number: int = 9
    two_step: float = 0.2
    train_problems: int = 2000
    test_problems: int = 200


@dataclass
class DataConfig:
    """`kind` says which generator reads the section: regbench (the fields below, next-symbol
    data over n_symbols) or arith (byte-level text; its own `arith` section, the RegBench
    fields unused)."""
    name: str = "regbench_easy"
    kind: str = "regbench"
    vocab_size: int = 20
    n_symbols: int = 18
    seed: int = 1234
    num_states: list[int] = field(default_factory=lambda: [3, 5])
    alphabet_size: list[int] = field(default_factory=lambda: [3, 6])
    transitions_per_state: list[int] = field(default_factory=lambda: [1, 2])
    strings_per_instance: list[int] = field(default_factory=lambda: [20, 30])
    string_length: list[int] = field(default_factory=lambda: [1, 10])
    train_automata: int = 2000
    heldout_automata: int = 200
    seq_len: int = 128
    arith: Optional[ArithDataConfig] = None


@dataclass
class RegBenchEvalConfig:
    instances: int = 200
    ngram_alpha: float = 0.1
    batch_size: int = 50


@dataclass
class InductionEvalConfig:
    """jobs/evals/induction.py: prefix-matching scores and, for lidas, ancestry concentration."""
    sequences: int = 64      # repeated random sequences scored
    length: int = 10         # distinct symbols per copy (at most 18)
    top_k: int = 4           # heads counted as "top" (metric induction_topk_mean, ancestry)
    ancestors_m: int = 2     # ancestry statistic: top-k heads descending from the best m ancestor heads


@dataclass
class AblationEvalConfig:
    """jobs/evals/ablation.py: every fraction in one job (eval settings are semantic, so a sweep
    over `fraction` would retrain); `fraction` gives the headline metrics."""
    fraction: float = 0.2    # headline: the top fraction of head applications ablated
    fractions: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.4])  # the curve
    prompts: int = 32        # prompts per few-shot task (jobs/data/fewshot.py)
    reference_batch: int = 16  # training-distribution instances the head means are taken over


@dataclass
class Gsm8kEvalConfig:
    """jobs/evals/gsm8k.py. Problems from `path`: a JSONL file (`{split}` -> train/test), `hub`
    (`openai/gsm8k` through Hugging Face `datasets`), or null: the arith data's own splits."""
    n_shots: int = 8
    shot_seed: int = 1234
    limit: Optional[int] = None          # first N test problems; null = all
    max_new_tokens: int = 256
    path: Optional[str] = None


@dataclass
class JobResources:
    cpus: int = 1
    gpus: float = 0
    memory_gb: float = 2


@dataclass
class TrainResources(JobResources):
    nodes: int = 1


@dataclass
class EvalConfig:
    jobs: list[str] = field(default_factory=lambda: ["regbench"])
    resources: JobResources = field(default_factory=JobResources)
    regbench: RegBenchEvalConfig = field(default_factory=RegBenchEvalConfig)
    induction: InductionEvalConfig = field(default_factory=InductionEvalConfig)
    ablation: AblationEvalConfig = field(default_factory=AblationEvalConfig)
    gsm8k: Gsm8kEvalConfig = field(default_factory=Gsm8kEvalConfig)


@dataclass
class ClusterConfig:
    name: str = "local"
    address: Optional[str] = None
    num_cpus: Optional[int] = None
    num_gpus: Optional[int] = None
    include_dashboard: bool = False
    dashboard_host: str = "127.0.0.1"
    # cluster=ray: ship the project to the nodes with Ray's runtime_env (working_dir); null =
    # ship when cluster.address is not on this machine (a shared filesystem needs false).
    ship_code: Optional[bool] = None
    # The --dry-run GPU-hours estimate: training FLOPs / (peak x MFU) / 3600 (H100 bf16 dense).
    gpu_peak_flops_per_s: float = 989e12
    gpu_mfu: float = 0.4
    # cluster=slurm / slurm_array (orchestrator/slurm.py): the allocation's #SBATCH values,
    # extra #SBATCH options, and shell lines run first in the job (module loads, venv activation).
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int = 4
    mem_gb: float = 16
    time: str = "04:00:00"
    requeue: bool = True
    sbatch: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    ray_start_timeout_s: int = 300


@dataclass
class NanotronSettings:
    """backend=nanotron (jobs/nanotron, conf/backend/nanotron.yaml): dp = the job's GPUs / (tp x pp)."""
    tp: int = 1
    pp: int = 1
    micro_batch_size: int = 8
    dtype: str = "bfloat16"
    dataset: Optional[str] = None          # a Hugging Face dataset name, or
    dataset_split: str = "train"
    dataset_config: Optional[str] = None
    text_column: str = "text"
    tokenized_path: Optional[str] = None   # a folder of tokenized shards (nanotron's nanoset)
    token_size_in_bytes: int = 4
    dummy_data: bool = False               # nanotron's random tokens instead (GPU smoke tests)
    tokenizer: str = "HuggingFaceTB/SmolLM-360M"
    zero_stage: int = 0
    run_train: str = "run_train.py"        # nanotron's entry script (in its checkout)


@dataclass
class BackendConfig:
    name: str = "torch"
    device: str = "auto"
    nanotron: Optional[NanotronSettings] = None


@dataclass
class StoreConfig:
    root: str = "outputs"


@dataclass
class AdaptiveConfig:
    """Seeds added in a pre-declared schedule of looks until the comparison is decided
    (statistics.md (f)); off while `metric` is null."""
    metric: Optional[str] = None
    max_seeds: int = 8
    looks: list[int] = field(default_factory=lambda: [3, 5, 8])
    alpha: float = 0.05
    delta_min: float = 0.02
    baseline: str = "dense"


@dataclass
class TrackerConfig:
    """Weights & Biases (orchestrator/tracking.py); not part of the run id."""
    enabled: Optional[bool] = None         # null: on when the wandb package is importable
    project: str = "depthgrowth"
    entity: Optional[str] = None
    mode: Optional[str] = None             # null: $WANDB_MODE if set, else offline
    log_every: Optional[int] = None        # steps between logged rows; null: train.log_every
    init_timeout_s: float = 20.0
    finish_timeout_s: float = 300.0
    sweep: Optional[str] = None            # set by the CLI; W&B group <sweep>/<family>-<size>


@dataclass
class Config:
    seed: int = 0
    family: FamilyConfig = field(default_factory=FamilyConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resources: TrainResources = field(default_factory=TrainResources)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    tracker: TrackerConfig = field(default_factory=TrackerConfig)


# ---------------------------------------------------------------------------------------------
# Composition

def hydra_session(conf_dir: Optional[Path] = None) -> Any:
    """Context manager that points Hydra at `conf_dir` (default CONF_DIR; re-entrant: clears a
    previous session)."""
    GlobalHydra.instance().clear()
    return initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base=None)


def compose_run(overrides: list[str], catalog: Mapping[str, frozenset[str]] | None = None) -> dict:
    """Compose one grid point (inside `hydra_session`), validate it and fill in derived values.

    `catalog` maps each job name (train and the registered evaluations) to the metrics it
    records, for the checks of `eval.jobs` and `adaptive.metric`. Returns the fully resolved
    config as a plain dict."""
    return compose_runs([overrides], catalog)[0]


def compose_runs(points: list[list[str]], catalog: Mapping[str, frozenset[str]] | None = None) -> list[dict]:
    """`compose_run` of each override list, composing each distinct set of config-group choices
    once: a sweep of 1,000 seeds composes one config, not 1,000 (Hydra takes ~0.13 s each).

    Hydra composes in two steps: the group choices build the config from conf/, then the value
    overrides are applied to it in order. This does the same, with Hydra's own classification
    and application of the overrides, only on a copy of a cached first step, merged into the
    schema first: a value of the wrong type or an unknown key fails as it would after Hydra."""
    loader = GlobalHydra.instance().config_loader()
    parser = OverridesParser.create(config_loader=loader)
    bases: dict[tuple[str, ...], DictConfig] = {}
    parsed_once: dict[str, Override] = {}
    configs = []
    for overrides in points:
        try:
            for o in overrides:
                if o not in parsed_once:
                    parsed_once[o] = parser.parse_overrides([o])[0]
        except HydraException as e:
            raise ConfigError(_first_line(e)) from None
        parsed = [parsed_once[o] for o in overrides]
        # An added or deleted key must meet the schema after Hydra: such a point is composed whole.
        whole = any(o.is_add() or o.is_force_add() or o.is_delete() for o in parsed)
        is_value = [not whole and _is_value_override(o, loader.repository) for o in parsed]
        values = [o for o, v in zip(parsed, is_value) if v]
        choices = tuple(o.input_line for o, v in zip(parsed, is_value) if not v)
        if choices not in bases:
            bases[choices] = _typed(_composed(list(choices), overrides))
        cfg = copy.deepcopy(bases[choices])
        try:
            ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        except HydraException as e:
            raise ConfigError(_override_message(e)) from None
        configs.append(_resolved(cfg, catalog))
    return configs


def _is_value_override(o: Override, repository: Any) -> bool:
    """What Hydra applies after composing (hydra/_internal/defaults_list.py, Overrides)."""
    return not o.is_hydra_override() and (isinstance(o.value(), dict)
                                          or not repository.group_exists(o.key_or_group))


def _composed(choices: list[str], overrides: list[str]) -> DictConfig:
    try:
        return compose("config", overrides=choices)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_message(e)) from None
    except MissingConfigException as e:
        raise ConfigError(_missing_choice_message(str(e), overrides)) from None
    except (HydraException, OmegaConfBaseException, ValueError) as e:  # ValueError: Hydra's defaults list
        raise ConfigError(_override_message(e)) from None


def _override_message(e: Exception) -> str:
    unknown = re.match(r"Could not override '([^']+)'", str(e))
    if unknown and "To append to your config" in str(e):
        return (f"{unknown.group(1)}: unknown key; check the spelling (see conf/ "
                f"and orchestrator/config.py)")
    if isinstance(e.__cause__, OmegaConfBaseException):  # a value the schema refuses
        return _schema_message(e.__cause__)
    return _first_line(e)


def _typed(cfg: DictConfig) -> DictConfig:
    """The composed config merged into the schema: keys and types checked, from here on too."""
    try:
        typed = OmegaConf.merge(OmegaConf.structured(Config), cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(_schema_message(e)) from None
    OmegaConf.set_struct(typed, True)  # as Hydra's own: a value override cannot add a key
    return typed


def _resolved(typed: DictConfig, catalog: Mapping[str, frozenset[str]] | None) -> dict:
    """Resolve interpolations, fill in derived values, then check what the schema cannot."""
    try:
        plain = OmegaConf.to_container(typed, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError(_schema_message(e)) from None
    _fill_derived(plain)
    _check(plain, catalog or {})
    return plain


def yaml_message(e: yaml.YAMLError) -> str:
    """A syntax error in a file of the config groups, as one line naming the file and line."""
    mark = getattr(e, "problem_mark", None)
    where = f"{mark.name}:{mark.line + 1}" if mark else str(CONF_DIR)
    problem = getattr(e, "problem", None) or _first_line(e)
    return f"{where}: YAML syntax error ({problem}); fix that file"


def _first_line(e: Exception) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__


def _missing_choice_message(text: str, overrides: list[str]) -> str:
    """Hydra's multi-line 'Could not find family/foo ... Available options' into one line."""
    m = re.search(r"Could not (?:find|load) '([^']+)'", text)
    if not m:
        return _first_line(Exception(text))
    group, _, choice = m.group(1).rpartition("/")
    options = [s.strip() for s in text.split("Available options in")[-1].splitlines()[1:]
               if s.startswith("\t") and "provider=" not in s]
    if not group:
        return f"config '{choice}' not found in {CONF_DIR}"
    return (f"{group}={choice}: no such {group}; choose one of: {', '.join(options)} "
            f"(files in conf/{group}/)")


def _schema_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or "config"
    msg = str(e).splitlines()[0]
    if "not in" in msg:
        return f"{key}: unknown key; check the spelling (see conf/ and orchestrator/config.py)"
    m = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if m:
        value, _, wanted = m.groups()
        return f"{key}={value}: expected {wanted.lower()}, got {value!r}"
    m = re.search(r"(\w+) is not a subclass of (\w+)Config", msg)
    if m:
        section = m.group(2).lower()
        return f"{section}: is a config section, not a {m.group(1)}; set one of its keys ({section}.<key>=...)"
    return f"{key}: {msg}"


# ---------------------------------------------------------------------------------------------
# Derived values and value checks

def _fill_derived(c: dict) -> None:
    """Replace the family's nulls by the size's defaults, so the run id sees concrete values (and
    a null tracker.log_every by train.log_every)."""
    fam, model = c["family"], c["model"]
    b = model["block_size"]
    if fam["name"] == "lidas" and fam["growth"] is not None:
        g = fam["growth"]
        g["block_layers"] = b if g["block_layers"] is None else g["block_layers"]
    if fam["name"] == "looped" and fam["loop"] is not None:
        lp = fam["loop"]
        lp["block_layers"] = b if lp["block_layers"] is None else lp["block_layers"]
        edge = lp["block_layers"] // 2
        lp["prelude_layers"] = edge if lp["prelude_layers"] is None else lp["prelude_layers"]
        lp["coda_layers"] = edge if lp["coda_layers"] is None else lp["coda_layers"]
        if lp["loops"] is None and lp["block_layers"] > 0:
            middle = model["n_layers"] - lp["prelude_layers"] - lp["coda_layers"]
            lp["loops"] = middle // lp["block_layers"]
    if c["tracker"]["log_every"] is None:
        c["tracker"]["log_every"] = c["train"]["log_every"]
    if fam["name"] != "lidas":
        fam["growth"] = None
    if fam["name"] != "looped":
        fam["loop"] = None
    if c["data"]["kind"] != "arith":
        c["data"]["arith"] = None


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(key: str, value: Any, allowed: list) -> None:
    _require(value in allowed, f"{key}={value}: not allowed; choose one of: "
             f"{', '.join(map(str, allowed))}")


def _positive(c: dict, *keys: str) -> None:
    for key in keys:
        value = _get(c, key)
        _require(value > 0, f"{key}={value}: must be > 0")


def _get(c: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        c = c[part]
    return c


FAMILIES = ["dense", "lidas", "looped"]


def adaptive_looks(a: dict) -> list[int]:
    """The declared looks up to max_seeds, ending at max_seeds (S_max)."""
    return [n for n in a["looks"] if n < a["max_seeds"]] + [a["max_seeds"]]


def _check_adaptive(a: dict, metrics: frozenset[str]) -> None:
    if a["metric"] is None:
        return
    if metrics:
        _one_of("adaptive.metric", a["metric"], sorted(metrics))
    looks = adaptive_looks(a)
    _require(looks[0] >= 2 and all(x < y for x, y in zip(looks, looks[1:])),
             f"adaptive.looks={a['looks']}: must be increasing seed counts from 2 up to "
             f"adaptive.max_seeds={a['max_seeds']}")
    _require(0 < a["alpha"] < 1, f"adaptive.alpha={a['alpha']}: must be in (0, 1)")
    _require(a["delta_min"] > 0, f"adaptive.delta_min={a['delta_min']}: must be > 0")


def procs_per_node(resources: Mapping) -> int:
    """Training processes per node: one per whole GPU, or one on a CPU-only (or shared) GPU."""
    return max(1, int(resources["gpus"]))


def world_size(resources: Mapping) -> int:
    """Training ranks of a run: resources.nodes x processes per node."""
    return resources["nodes"] * procs_per_node(resources)


def _check_resources(c: dict) -> None:
    r, cl = c["resources"], c["cluster"]
    _require(r["nodes"] >= 1, f"resources.nodes={r['nodes']}: must be >= 1")
    _require(r["gpus"] <= 1 or float(r["gpus"]).is_integer(),
             f"resources.gpus={r['gpus']}: more than one GPU per node must be a whole number "
             f"(one training process per GPU)")
    _require(r["nodes"] == 1 or r["gpus"] == 0 or float(r["gpus"]).is_integer(),
             f"resources.gpus={r['gpus']}: a multi-node job needs whole GPUs per node")
    world, batch = world_size(r), c["train"]["batch_size"]
    _require(batch % world == 0,
             f"train.batch_size={batch}: must be divisible by the {world} training processes "
             f"(resources.nodes={r['nodes']} x {procs_per_node(r)} per node); change one of them")
    _require(cl["gpu_peak_flops_per_s"] > 0 and 0 < cl["gpu_mfu"] <= 1,
             f"cluster: gpu_peak_flops_per_s={cl['gpu_peak_flops_per_s']} must be > 0 and "
             f"gpu_mfu={cl['gpu_mfu']} in (0, 1]")
    _require(cl["name"] != "ray" or bool(cl["address"]),
             "cluster.address: cluster=ray needs the address of a running cluster, e.g. "
             "cluster.address=10.0.0.5:6379 (or auto for the one started on this machine)")
    _check_dashboard(cl)


def _check_dashboard(cl: dict) -> None:
    """Ray fails with a traceback when the dashboard's packages (ray[default]) are missing."""
    if not cl["include_dashboard"] or cl["address"]:
        return
    from ray._private.utils import get_dashboard_dependency_error

    _require(get_dashboard_dependency_error() is None,
             "cluster.include_dashboard=true: Ray's dashboard needs `pip install 'ray[default]'` "
             "(same version as ray); or leave the dashboard off")


# sbatch reads `#SBATCH` lines itself, without a shell: their values must be single plain words.
SBATCH_WORD = re.compile(r"[A-Za-z0-9_.,:@%+=/-]+")


def _check_slurm(cl: dict) -> None:
    if cl["name"] not in ("slurm", "slurm_array"):
        return
    for key in ("partition", "account", "qos", "time"):
        value = cl[key]
        _require(value is None or bool(SBATCH_WORD.fullmatch(str(value))),
                 f"cluster.{key}={value!r}: not a Slurm name (letters, digits and _.,:@%+=/- only)")
    for option in cl["sbatch"]:
        _require(option.startswith("-") and bool(SBATCH_WORD.fullmatch(option)),
                 f"cluster.sbatch: {option!r} is not one sbatch option such as --constraint=a100 "
                 f"(one word, letters, digits and _.,:@%+=/- only)")
    for line in cl["setup"]:
        _require("\n" not in line and "\r" not in line,
                 f"cluster.setup: {line!r} spans several lines; give one list item per line")
    _require(cl["nodes"] >= 1 and cl["cpus_per_node"] >= 1 and cl["gpus_per_node"] >= 0
             and cl["mem_gb"] > 0 and cl["ray_start_timeout_s"] > 0,
             f"cluster: nodes={cl['nodes']} and cpus_per_node={cl['cpus_per_node']} must be >= 1, "
             f"gpus_per_node={cl['gpus_per_node']} >= 0, mem_gb={cl['mem_gb']} and "
             f"ray_start_timeout_s={cl['ray_start_timeout_s']} > 0")


def _check_ablation(a: dict) -> None:
    for name, value in [("fraction", a["fraction"]), *(("fractions", f) for f in a["fractions"])]:
        _require(0 < value <= 1, f"eval.ablation.{name}: {value} must be in (0, 1] (a fraction of the heads)")
    _require(len(a["fractions"]) > 0, "eval.ablation.fractions=[]: list at least one fraction, e.g. [0.2]")
    _require(a["prompts"] > 0 and a["reference_batch"] > 0,
             f"eval.ablation.prompts={a['prompts']}, reference_batch={a['reference_batch']}: must be positive")


def _check(c: dict, catalog: Mapping[str, frozenset[str]]) -> None:
    _require(c["seed"] >= 0, f"seed={c['seed']}: must be a non-negative integer")
    fam, m, t, d = c["family"], c["model"], c["train"], c["data"]
    _one_of("family.name", fam["name"], FAMILIES)
    _positive(c, "model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads",
              "model.d_ff", "model.vocab_size", "model.max_seq_len", "model.block_size",
              "model.init_std", "train.steps", "train.batch_size", "train.lr",
              "train.checkpoint_every", "train.log_every", "data.train_automata",
              "data.heldout_automata", "data.seq_len", "resources.cpus", "eval.resources.cpus",
              "eval.regbench.instances", "eval.regbench.batch_size", "eval.regbench.ngram_alpha",
              "eval.induction.sequences", "eval.induction.top_k", "eval.induction.ancestors_m")
    _require(1 <= c["eval"]["induction"]["length"] <= 18 and 2 * c["eval"]["induction"]["length"] + 2 <= m["max_seq_len"],
             f"eval.induction.length={c['eval']['induction']['length']}: must be in [1, 18] and fit twice"
             f" (plus 2 separators) in model.max_seq_len={m['max_seq_len']}")
    _check_ablation(c["eval"]["ablation"])
    _require(m["d_model"] % m["n_heads"] == 0,
             f"model.n_heads={m['n_heads']}: must divide model.d_model={m['d_model']}")
    _require(m["n_heads"] % m["n_kv_heads"] == 0,
             f"model.n_kv_heads={m['n_kv_heads']}: must divide model.n_heads={m['n_heads']}")
    _require((m["d_model"] // m["n_heads"]) % 2 == 0,
             f"model.d_model/n_heads={m['d_model'] // m['n_heads']}: RoPE needs an even head size")
    _require(m["vocab_size"] >= d["vocab_size"],
             f"model.vocab_size={m['vocab_size']}: smaller than data.vocab_size={d['vocab_size']}")
    _require(d["seq_len"] <= m["max_seq_len"],
             f"data.seq_len={d['seq_len']}: longer than model.max_seq_len={m['max_seq_len']}")
    _require(0 <= t["warmup_steps"] < t["steps"],
             f"train.warmup_steps={t['warmup_steps']}: must be in [0, train.steps={t['steps']})")
    _require(0 <= t["min_lr_ratio"] <= 1, f"train.min_lr_ratio={t['min_lr_ratio']}: must be in [0, 1]")
    _require(t["max_retries"] >= 0, f"train.max_retries={t['max_retries']}: must be >= 0")
    _require(c["resources"]["gpus"] >= 0, f"resources.gpus={c['resources']['gpus']}: must be >= 0")
    _check_resources(c)
    _check_slurm(c["cluster"])
    _one_of("backend.name", c["backend"]["name"], ["torch", "nanotron"])
    if c["backend"]["name"] == "nanotron":
        _check_nanotron(c)
    _one_of("backend.device", c["backend"]["device"], ["auto", "cpu", "cuda"])
    if fam["name"] == "lidas":
        _check_growth(fam["growth"], m, t)
    if fam["name"] == "looped":
        _check_loop(fam["loop"], m)
    _check_data(d)
    _check_gsm8k(c["eval"]["gsm8k"])
    _check_tracker(c["tracker"], t)
    if catalog:
        for job in c["eval"]["jobs"]:
            _one_of("eval.jobs", job, sorted(set(catalog) - {"train"}))
        _check_eval_data(c["eval"]["jobs"], d)
    metrics = frozenset().union(*(catalog[j] for j in ["train", *c["eval"]["jobs"]])) if catalog else frozenset()
    _check_adaptive(c["adaptive"], metrics)


def _check_nanotron(c: dict) -> None:
    """The nanotron layout and data, before anything is rendered (jobs/nanotron/render.py)."""
    nt, r, fam = c["backend"]["nanotron"], c["resources"], c["family"]["name"]
    _require(fam != "looped", "family=looped: nanotron has no weight-shared layers; "
             "use backend=torch (it runs looped models on GPUs with DDP)")
    _require(nt is not None, "backend.nanotron: missing; use backend=nanotron (conf/backend/nanotron.yaml)")
    _require(r["gpus"] >= 1 and float(r["gpus"]).is_integer(),
             f"resources.gpus={r['gpus']}: backend=nanotron trains on whole CUDA GPUs only; "
             f"use a GPU size or backend=torch")
    world, tp, pp, mbs = world_size(r), nt["tp"], nt["pp"], nt["micro_batch_size"]
    _require(tp >= 1 and pp >= 1 and mbs >= 1, f"backend.nanotron: tp={tp}, pp={pp} and "
             f"micro_batch_size={mbs} must be >= 1")
    _require(world % (tp * pp) == 0, f"backend.nanotron: tp={tp} x pp={pp} must divide the "
             f"{world} GPUs (resources.nodes x resources.gpus); dp is the quotient")
    per_step = world // (tp * pp) * mbs
    _require(c["train"]["batch_size"] % per_step == 0,
             f"train.batch_size={c['train']['batch_size']}: must be a multiple of dp "
             f"{world // (tp * pp)} x backend.nanotron.micro_batch_size={mbs}")
    _require(nt["dummy_data"] + (nt["dataset"] is not None) + (nt["tokenized_path"] is not None) == 1,
             "backend.nanotron: set exactly one of dataset=<Hugging Face name>, "
             "tokenized_path=<folder of tokenized shards> or dummy_data=true (with the others null)")
    _one_of("backend.nanotron.dtype", nt["dtype"], ["bfloat16", "float32"])
    _one_of("backend.nanotron.zero_stage", nt["zero_stage"], [0, 1])


def _check_growth(g: Optional[dict], m: dict, t: dict) -> None:
    _require(g is not None, "family.growth: missing; family=lidas needs its growth section")
    b, n0 = g["block_layers"], g["initial_blocks"]
    _require(b > 0, f"family.growth.block_layers={b}: must be > 0")
    _require(n0 > 0, f"family.growth.initial_blocks={n0}: must be > 0")
    _require(m["n_layers"] % b == 0,
             f"family.growth.block_layers={b}: must divide model.n_layers={m['n_layers']}")
    final_blocks = m["n_layers"] // b
    _require(n0 < final_blocks,
             f"family.growth.initial_blocks={n0}: the schedule does not grow (final depth "
             f"{m['n_layers']} = {final_blocks} blocks of {b}); use fewer initial blocks")
    stages = final_blocks - n0 + 1
    _require(t["steps"] >= stages,
             f"train.steps={t['steps']}: fewer than the {stages} growth stages; raise train.steps")
    _require(g["alpha"] >= 0, f"family.growth.alpha={g['alpha']}: must be >= 0")
    _one_of("family.growth.optimizer_state", g["optimizer_state"], ["copy", "reset"])


def _check_loop(lp: Optional[dict], m: dict) -> None:
    _require(lp is not None, "family.loop: missing; family=looped needs its loop section")
    e, k, r, dd = lp["prelude_layers"], lp["block_layers"], lp["loops"], lp["coda_layers"]
    _require(k > 0, f"family.loop.block_layers={k}: must be > 0")
    _require(e >= 0 and dd >= 0, f"family.loop: prelude_layers={e} and coda_layers={dd} must be >= 0")
    _require(k + e + dd <= m["n_layers"],
             f"family.loop.block_layers={k}: block plus prelude and coda ({k + e + dd} layers) "
             f"exceed model.n_layers={m['n_layers']}")
    _require(r >= 2, f"family.loop.loops={r}: a looped model needs loops >= 2 (set "
             f"family.loop.loops or a smaller family.loop.block_layers)")
    depth = e + k * r + dd
    _require(depth == m["n_layers"],
             f"family.loop: prelude {e} + block {k} x loops {r} + coda {dd} = {depth} layers, "
             f"but model.n_layers={m['n_layers']}; make them equal (same per-token FLOPs as dense)")


def _check_tracker(tr: dict, t: dict) -> None:
    _require(not (tr["enabled"] and importlib.util.find_spec("wandb") is None),
             "tracker.enabled=true: the wandb package is not installed; "
             "`pip install wandb==0.31.0` or use tracker=none")
    if tr["mode"] is not None:
        _one_of("tracker.mode", tr["mode"], ["offline", "online"])
    _require(tr["log_every"] > 0 and tr["log_every"] % t["log_every"] == 0,
             f"tracker.log_every={tr['log_every']}: must be a positive multiple of "
             f"train.log_every={t['log_every']} (the trainer reports every train.log_every steps)")
    _require(tr["init_timeout_s"] > 0 and tr["finish_timeout_s"] > 0,
             f"tracker: init_timeout_s={tr['init_timeout_s']} and "
             f"finish_timeout_s={tr['finish_timeout_s']} must be > 0")


DATA_KINDS = ["regbench", "arith"]


def _check_data(d: dict) -> None:
    _one_of("data.kind", d["kind"], DATA_KINDS)
    if d["kind"] == "arith":
        _check_arith(d)
        return
    for key in ("num_states", "alphabet_size", "transitions_per_state", "strings_per_instance",
                "string_length"):
        lo_hi = d[key]
        _require(len(lo_hi) == 2 and 1 <= lo_hi[0] <= lo_hi[1],
                 f"data.{key}={lo_hi}: must be [low, high] with 1 <= low <= high")
    _require(d["alphabet_size"][1] <= d["n_symbols"],
             f"data.alphabet_size={d['alphabet_size']}: more than data.n_symbols={d['n_symbols']}")
    _require(d["vocab_size"] == d["n_symbols"] + 2,
             f"data.vocab_size={d['vocab_size']}: must be n_symbols + 2 (separator and pad)")


def _check_arith(d: dict) -> None:
    from jobs.tokenizer import VOCAB_SIZE

    a = d["arith"]
    _require(a is not None, "data.arith: missing; data.kind=arith needs its arith section (conf/data/arith.yaml)")
    _require(d["vocab_size"] == VOCAB_SIZE,
             f"data.vocab_size={d['vocab_size']}: byte-level text needs {VOCAB_SIZE} (256 bytes + BOS, EOS, pad)")
    _require(a["max_number"] >= 1 and 0 <= a["two_step"] <= 1,
             f"data.arith: max_number={a['max_number']} must be >= 1 and two_step={a['two_step']} in [0, 1]")
    _require(a["train_problems"] >= 1 and a["test_problems"] >= 1,
             f"data.arith: train_problems={a['train_problems']} and test_problems={a['test_problems']} must be >= 1")
    _require(d["seq_len"] >= 128, f"data.seq_len={d['seq_len']}: text rows need >= 128 bytes "
             f"(a worked example is ~110); raise model.max_seq_len")


def _check_gsm8k(g: dict) -> None:
    _require(g["n_shots"] >= 0 and g["max_new_tokens"] >= 1 and (g["limit"] is None or g["limit"] >= 1),
             f"eval.gsm8k: n_shots={g['n_shots']} must be >= 0, max_new_tokens={g['max_new_tokens']} "
             f">= 1 and limit={g['limit']} null or >= 1")
    if g["path"] == "hub":
        _require(importlib.util.find_spec("datasets") is not None,
                 "eval.gsm8k.path=hub: reading openai/gsm8k needs the `datasets` package; install it "
                 "or give a GSM8K JSONL path")
    elif g["path"] is not None:
        for split in ("train", "test"):
            path = Path(g["path"].replace("{split}", split)).expanduser()
            _require(path.is_file(), f"eval.gsm8k.path={g['path']}: {path} is not a file; give a GSM8K "
                     f"JSONL (use {{split}} for separate train/test files) or null")


def _check_eval_data(jobs: list[str], d: dict) -> None:
    """An evaluation runs only on the data kinds it declares (jobs/registry.py `evaluation`)."""
    from jobs.registry import data_kinds

    kinds = data_kinds()
    for job in jobs:
        if job in kinds:
            _require(d["kind"] in kinds[job],
                     f"eval.jobs: {job} needs data.kind={'/'.join(sorted(kinds[job]))}, but data={d['name']} "
                     f"is data.kind={d['kind']}; drop {job} from eval.jobs or choose other data")
