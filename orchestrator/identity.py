"""Run identity: a stable hash of what determines a run's results, not of where or how it runs.

The hash is over the canonical JSON of the run config's semantic part. Its form is the one of
the store's first format, kept so that every run of an existing store keeps its id: that format
had one schema for every component, so each config carried the sections of the families, data
kinds and backends it did not use (as null, or at that schema's defaults), and the settings of
the evaluations known then. `semantic_config` rebuilds exactly that form. An evaluation added
since is not part of the id: its settings are recorded with its result instead (`settings_digest`,
orchestrator/plan.py reruns it when they change), so adding an evaluation retrains nothing; so are
the settings added since to an evaluation of format 1 (`ADDED_EVAL_SETTINGS`). The
revision of an evaluation's metrics (`revision=` of `@evaluation`, bumped when what they mean
changes) is recorded the same way, for every evaluation: its results of an earlier revision are
computed again on the run's checkpoint, never mixed with the new meaning.

Data settings added since format 1 are left out while they are at the value that behaves as
format 1 did: `data.train_sequences` (and the `data.validation_sequences` that goes with it)
while it is null, the infinite stream of format 1; `data.warmup` (a curriculum) and `data.facts`
(facts mixed into the stream) while they are null.
A warm-up's `share` is never part of the id: the steps it gives are (derived before the id is
computed), so a warm-up of 600 steps is the same run however it was given.
`data.cut_at_context` never changes the data
(it only decides whether planning refuses a context shorter than the longest instance; the
generator cuts at the context's end as format 1 did), so it is never part of the id.

The seed keys added since, `init_seed` and `data_seed` (config/run.py), are in the id only where
they change what the run computes: a key that is null, or equal to `seed`, behaves as format 1's
single seed did and is left out. So every run planned before them keeps its id, and `init_seed=3
seed=3` is the same run as `seed=3`: the effective seeds, not how they were spelled, decide."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any, Callable, Optional

from common.atomic import yaml_text
from common.settings import to_dict
from jobs.evals import EVALUATIONS
from store.records import ConfigsRecord

# Sections and keys that do not change a run's results: where it runs, how it is tracked and
# stored, how often it checkpoints, keeps snapshots or retries, whether it is compiled and which CPU
# kernels it runs (like the thread count, they move the last bits only, as nanotron's attention
# kernel does), and which evaluations are listed (a newly listed evaluation runs on the existing run
# instead of retraining it).
NON_SEMANTIC = ("cluster", "store", "resources", "tracker", "adaptive", "train.max_retries",
                "train.checkpoint_every", "train.snapshots", "train.compile", "train.cpu_capability", "eval.jobs",
                "eval.resources", "backend.nanotron.project", "backend.nanotron.attn_implementation",
                "data.cut_at_context")
# Data settings of the training set: in the id only when not at format 1's behaviour (the stream).
FIXED_SET_KEYS = ("train_sequences", "validation_sequences")
# Data settings in the id only when set (null behaves as format 1 did).
NULL_AS_FORMAT1 = ("warmup", "facts")
# Top-level seeds in the id only when they differ from `seed` (null means `seed`).
SEED_AXES = ("init_seed", "data_seed")

# The form of format 1 (see the module docstring).
FORMAT1_EVALUATIONS = ("regbench", "induction", "ablation", "gsm8k")
# Settings added since to an evaluation of format 1: outside the id, recorded with its result as a
# newer evaluation's settings are, so that changing one reruns that evaluation only.
ADDED_EVAL_SETTINGS = {"ablation": ("ks",)}
FORMAT1_SECTIONS = {"family": ("growth", "loop"), "data": ("arith",), "backend": ("nanotron",)}
FORMAT1_REGBENCH_FIELDS = {  # what an arith run's data section held: that schema's defaults
    "n_symbols": 18, "num_states": [3, 5], "alphabet_size": [3, 6], "transitions_per_state": [1, 2],
    "strings_per_instance": [20, 30], "string_length": [1, 10], "train_automata": 2000,
    "heldout_automata": 200}


def _plain(cfg: Any) -> dict:
    is_instance = dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
    return dataclasses.asdict(cfg) if is_instance else copy.deepcopy(cfg)


def semantic_config(cfg: Any) -> dict:
    """The part of a run config (typed, or a stored dict) that the run id is computed from."""
    out = _plain(cfg)
    for dotted in NON_SEMANTIC:
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            node = node.get(p) or {}
        node.pop(leaf, None)
    if out["data"].get("train_sequences") is None:
        for key in FIXED_SET_KEYS:
            out["data"].pop(key, None)
    for key in NULL_AS_FORMAT1:
        if out["data"].get(key, 0) is None:
            del out["data"][key]
    for key in SEED_AXES:
        if out.get(key) is None or out[key] == out.get("seed"):
            out.pop(key, None)
    if isinstance(out["data"].get("warmup"), dict):
        out["data"]["warmup"].pop("share", None)  # the means: the steps it gave are the meaning
    for section, keys in FORMAT1_SECTIONS.items():
        for key in keys:
            out[section].setdefault(key, None)
    if out["data"].get("kind") == "arith":
        for key, value in FORMAT1_REGBENCH_FIELDS.items():
            out["data"].setdefault(key, value)
    out["eval"] = {k: v for k, v in out["eval"].items() if k in FORMAT1_EVALUATIONS}
    for job, keys in ADDED_EVAL_SETTINGS.items():
        for key in keys:
            (out["eval"].get(job) or {}).pop(key, None)
    return out


def outside_run_id(key: str) -> bool:
    """Whether a dotted override key (or a config group, `cluster/...`) leaves the run id alone:
    a NON_SEMANTIC key, a setting of an evaluation added since format 1, or one added since to an
    evaluation of format 1 (recorded with its result, so that changing it reruns that evaluation
    only)."""
    if any(key == k or key.startswith(f"{k}.") or key.startswith(f"{k}/") for k in NON_SEMANTIC):
        return True
    section, _, rest = key.partition(".")
    job, _, setting = rest.partition(".")
    if section != "eval" or not job:
        return False
    return job not in FORMAT1_EVALUATIONS or setting.split(".")[0] in ADDED_EVAL_SETTINGS.get(job, ())


def run_id(cfg: Any) -> str:
    """12 hex digits of sha256 over the canonical JSON of the semantic config (key order free)."""
    return _hash(_canonical(semantic_config(cfg)))


def run_ids(configs: list[Any]) -> list[str]:
    """`run_id` of each config; the seed variants of one config are serialised once."""
    canonical = SeedTemplates(lambda cfg: _canonical(semantic_config(cfg)))
    return [_hash(canonical(cfg)) for cfg in configs]


class PerSiblings:
    """`compute(cfg)` once per group of configs that differ at most in their seed.

    A grid's seed variants share every section object (orchestrator/config.py `with_seed`), so
    configs whose fields other than the seed are the same objects are one config but for the
    seed. Configs that share nothing are each computed, as they would be without this."""

    def __init__(self, compute: Callable[[Any], Any]):
        self.compute = compute
        # sibling key -> (a config of the group, kept so that the ids in the key stay its own; value)
        self.values: dict[tuple[int, ...], tuple[Any, Any]] = {}

    def __call__(self, cfg: Any) -> Any:
        key = tuple(id(value) for name, value in vars(cfg).items() if name != "seed")
        if key not in self.values:
            self.values[key] = (cfg, self.compute(cfg))
        return self.values[key][1]


# An int no config holds, rendered where a config's seed goes (the seed is an int at the top).
SEED_MARK = 7_301_989_252_113_573


class SeedTemplates:
    """`render(cfg)` for many seed variants: each group's text is rendered once with `SEED_MARK`
    for the seed and split around it; a config's text is then the seed's digits put in between
    (an int renders as its digits in JSON and YAML alike)."""

    def __init__(self, render: Callable[[Any], str]):
        self.render = render
        self.parts = PerSiblings(self._split)

    def _split(self, cfg: Any) -> Optional[tuple[str, str]]:
        if any(getattr(cfg, key, None) is not None for key in SEED_AXES):
            return None  # whether an init or data seed is in the id depends on the seed: rendered whole
        parts = self.render(dataclasses.replace(cfg, seed=SEED_MARK)).split(str(SEED_MARK))
        return (parts[0], parts[1]) if len(parts) == 2 else None  # None: rendered whole

    def __call__(self, cfg: Any) -> str:
        parts = self.parts(cfg)
        return self.render(cfg) if parts is None else f"{parts[0]}{cfg.seed}{parts[1]}"


def settings_digest(cfg: Any, job: str) -> str | None:
    """What an evaluation's result is recorded with, so that it reruns when it changes: a digest
    of its settings where they are not part of the run id (all of a newer evaluation's, those added
    since to a format-1 evaluation), and of its revision where that is past the first. None for
    training and for a format-1 evaluation of its first revision without added settings (its
    settings are in the id); an evaluation without settings digests its revision alone."""
    if job == "train":
        return None
    revision = EVALUATIONS[job].revision
    settings = getattr(cfg.eval, job, None)
    recorded: dict[str, Any] = {}
    if settings is not None:
        recorded = dataclasses.asdict(settings)
        if job in FORMAT1_EVALUATIONS:
            recorded = {key: recorded[key] for key in ADDED_EVAL_SETTINGS.get(job, ())}
    if revision > 1:
        recorded = {"settings": recorded, "revision": revision} if recorded else {"revision": revision}
    return _digest(recorded) if recorded else None


def _digest(obj: Any) -> str:
    return _hash(_canonical(obj))


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_label(cfg: Any) -> str:
    """Human name used in progress lines and trackers: `<family>-<size>-s<seed>`, then `-i<init
    seed>` and `-d<data seed>` for those set apart from the seed."""
    return f"{cfg.family.name}-{cfg.model.name}-s{cfg.seed}{seed_axes_label(cfg)}"


def seed_axes_label(cfg: Any) -> str:
    """`-i<init seed>-d<data seed>`, each part only where it is set and differs from the seed (a
    typed config or a stored dict, which may predate these keys)."""
    get = cfg.get if isinstance(cfg, dict) else lambda key, default=None: getattr(cfg, key, default)
    seed = get("seed")
    return "".join(f"-{letter}{get(key)}" for letter, key in zip("id", SEED_AXES)
                   if get(key) is not None and get(key) != seed)


def config_dict(cfg: Any) -> dict:
    """What a run's config.yaml holds: its resolved config."""
    return to_dict(cfg)


def config_yaml(cfg: Any) -> str:
    return yaml_text(config_dict(cfg))


def configs_record(run_ids: list[str], configs: list[Any]) -> ConfigsRecord:
    """The configs file of these runs (store/records.py): each group of seed variants' config once."""
    plain: list[dict] = []

    def add(cfg: Any) -> int:
        plain.append(config_dict(cfg))
        return len(plain) - 1
    group = PerSiblings(add)
    return {"configs": plain, "runs": {run_id: [group(cfg), cfg.seed] for run_id, cfg in zip(run_ids, configs)}}
