"""Composing the run config: Hydra composes it from conf/, each section is typed by the class its
component declares (config/), derived values are filled in and every declared constraint is
checked, so a bad override fails here, as one `ConfigError` line, before any job starts or any
file is written. Only planning composes; what a sweep planned is read back from the store."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Iterator, Optional, cast

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import IConfigRepository
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from common.settings import ConfigError, require, typed_node, validate, validate_field
from config.evals import EVAL_CONFIGS
from config.run import RunConfig, load_run_config, with_derived
from jobs.registry import recording_jobs

__all__ = ["CONF_DIR", "ConfigError", "RunConfig", "compose_run", "compose_runs", "hydra_session",
           "load_run_config"]

# The config groups; ORCHESTRATOR_CONF_DIR points at another copy (your own groups, or tests).
CONF_DIR = Path(os.environ.get("ORCHESTRATOR_CONF_DIR") or Path(__file__).resolve().parent.parent / "conf")


def config_groups(conf_dir: Optional[Path] = None) -> dict[str, list[str]]:
    """Each config group of conf/ with its options (the files in it), and `eval.jobs` with the
    registered evaluations: what `--help` lists, as Hydra apps do."""
    root = conf_dir or CONF_DIR
    groups = {d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in sorted(root.iterdir()) if d.is_dir()}
    return {**groups, "eval.jobs": EVAL_CONFIGS.names()}


# ---------------------------------------------------------------------------------------------
# Composition

def hydra_session(conf_dir: Optional[Path] = None) -> AbstractContextManager[None]:
    """Context manager that points Hydra at `conf_dir` (default CONF_DIR; re-entrant: clears a
    previous session)."""
    GlobalHydra.instance().clear()
    return initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base=None)


def compose_run(overrides: list[str]) -> RunConfig:
    """Compose one grid point (inside `hydra_session`), typed, derived and validated."""
    return compose_runs([overrides])[0]


def compose_runs(points: list[list[str]]) -> list[RunConfig]:
    """`compose_run` of each override list, composing each distinct set of config-group choices
    once: a sweep of 1,000 seeds composes one config, not 1,000 (Hydra takes ~0.13 s each).

    Hydra composes in two steps: the group choices build the config from conf/, then the value
    overrides are applied to it in order. This does the same, with Hydra's own classification
    and application of the overrides, only on a copy of a cached first step, typed first: a
    value of the wrong type or an unknown key fails as it would after Hydra.

    Seeds go further: points that differ only in a plain `seed=<n>` are the first such point
    with its seed replaced (`_Grid.seeded`), unless the config interpolates the seed. A grid of
    100,000 seeds then composes one config, and its configs share every section object: they
    are read-only (copy one before changing it)."""
    grid = _Grid()
    return [grid.compose(overrides) for overrides in points]


# Typed compositions by (digest of the config sources, group choices). Composing is a pure function
# of the two, and Hydra takes ~0.2 s for it: a process that plans again (the next look of an adaptive
# sweep, a report, a notebook, the tests) reuses them while conf/ is unchanged.
_BASES: dict[tuple[str, tuple[str, ...]], DictConfig] = {}
BASES_KEPT = 64


def sources_digest() -> str:
    """A digest of the current Hydra session's config sources: the path and bytes of every file of
    each directory source (conf/), the path of each package source (installed code)."""
    digest = hashlib.sha256()
    for source in GlobalHydra.instance().config_loader().get_sources():
        digest.update(f"{source.scheme()}://{source.path}\0".encode())
        if source.scheme() == "file":
            root = Path(source.path)
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                digest.update(f"{path.relative_to(root)}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _typed_as_registered(node: DictConfig) -> bool:
    """Whether each section of a typed composition still has the class the registries give it
    (a plugin registered since would change it)."""
    return all(OmegaConf.get_type(node[key]) is cls for key, cls in RunConfig.section_types(node).items())


class _Grid:
    """The composition caches of one grid: parsed overrides and the seed-free part of each point
    (the typed compositions of group choices are kept across grids, `_BASES`)."""

    def __init__(self) -> None:
        loader = GlobalHydra.instance().config_loader()
        # Hydra's loader is its ConfigLoaderImpl, whose repository classifies an override as a value or a choice.
        assert isinstance(loader, ConfigLoaderImpl), f"Hydra's config loader is a {type(loader).__name__}"
        self.loader = loader
        self.parser = OverridesParser.create(config_loader=self.loader)
        self.sources = sources_digest()
        self.parsed: dict[str, Override] = {}
        self.seeded: dict[tuple[str, ...], Optional[RunConfig]] = {}  # None: the seed is interpolated

    def compose(self, overrides: list[str]) -> RunConfig:
        seed, others = _plain_seed(overrides)
        if seed is None:
            return _finished(self.node(overrides))
        if others not in self.seeded:
            node = self.node(overrides)
            self.seeded[others] = None if _interpolates_seed(node) else _finished(node)
        first = self.seeded[others]
        return _finished(self.node(overrides)) if first is None else with_seed(first, seed)

    def node(self, overrides: list[str]) -> DictConfig:
        """The typed config of the overrides before interpolations are resolved."""
        try:
            for o in overrides:
                if o not in self.parsed:
                    self.parsed[o] = self.parser.parse_overrides([o])[0]
        except HydraException as e:
            raise ConfigError(_first_line(e)) from None
        parsed = [self.parsed[o] for o in overrides]
        # An added or deleted key must meet the schema after Hydra: such a point is composed whole.
        whole = any(o.is_add() or o.is_force_add() or o.is_delete() for o in parsed)
        is_value = [not whole and _is_value_override(o, self.loader.repository) for o in parsed]
        values = [o for o, v in zip(parsed, is_value) if v]
        choices = tuple(_input_line(o) for o, v in zip(parsed, is_value) if not v)
        key = (self.sources, choices)
        if key not in _BASES or not _typed_as_registered(_BASES[key]):
            _BASES[key] = _typed(_composed(list(choices), overrides))
            while len(_BASES) > BASES_KEPT:
                del _BASES[next(iter(_BASES))]  # the oldest
        node = copy.deepcopy(_BASES[key])
        apply_value_overrides(node, values)
        return node


def _input_line(o: Override) -> str:
    """The override as written: `parse_overrides` sets it on every override it returns."""
    assert o.input_line is not None, "a parsed override keeps its input line"
    return o.input_line


# `seed=<n>` as Hydra's grammar reads an int (no sign, no leading zero, no underscore)
PLAIN_SEED = re.compile(r"seed=(0|[1-9][0-9]*)")


def _plain_seed(overrides: list[str]) -> tuple[Optional[int], tuple[str, ...]]:
    """The seed of a point whose only seed override is a plain `seed=<n>`, and its other
    overrides; (None, ()) for any other point."""
    seeds = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] == "seed"]
    match = PLAIN_SEED.fullmatch(seeds[0]) if len(seeds) == 1 else None
    if match is None:
        return None, ()
    return int(match.group(1)), tuple(o for o in overrides if o is not seeds[0])


def _interpolates_seed(node: DictConfig) -> bool:
    """Whether any value of the config interpolates something named seed (then a seed changes
    more than its own key, and each point is composed whole)."""
    def strings(value: object) -> Iterator[str]:
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value
    return any("${" in s and "seed" in s for s in strings(OmegaConf.to_container(node, resolve=False)))


def with_seed(config: RunConfig, seed: int) -> RunConfig:
    """`config` with another seed, checked against the seed's declared constraint; it shares
    every section with `config` (the seed is a leaf: no section derives or checks anything
    from it)."""
    validate_field(config, "seed", seed)
    return dataclasses.replace(config, seed=seed)


def typed_run(composed: DictConfig) -> RunConfig:
    """The run config of a config Hydra composed (whole, with every override): typed, derived and
    validated, as `compose_runs` makes each grid point."""
    return _finished(_typed(composed))


def apply_value_overrides(node: DictConfig, overrides: list[Override]) -> None:
    """Hydra's own application of value overrides to a composed config (in order, with its
    `key=value`, `+key`, `++key` and `~key` semantics). The one use of a private Hydra function:
    Hydra's public compose() would recompose the whole config for each grid point (~0.13 s);
    tests/unit/test_config.py fails loudly if Hydra changes it."""
    try:
        ConfigLoaderImpl._apply_overrides_to_config(overrides, node)
    except HydraException as e:
        raise ConfigError(_override_message(e)) from None


def _is_value_override(o: Override, repository: IConfigRepository) -> bool:
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


def _typed(composed: DictConfig) -> DictConfig:
    """The composed config merged into the sections' classes: keys and types checked, from here on
    too (struct mode, as Hydra's own: a value override cannot add a key)."""
    try:
        typed = typed_node(RunConfig, composed)
    except OmegaConfBaseException as e:
        raise ConfigError(_schema_message(e)) from None
    OmegaConf.set_struct(typed, True)
    # A mapping by metric name: its keys are the user's (checked against the jobs' metrics in
    # check_adaptive_metric), so adaptive.seed_sd.regbench_tvd=0.02 may add one.
    OmegaConf.set_struct(typed.adaptive.seed_sd, False)
    return typed


def _finished(node: DictConfig) -> RunConfig:
    """The typed object of a composed config: interpolations resolved, derived values filled in
    (so the run id sees concrete values), then every declared constraint checked."""
    for key, cls in RunConfig.section_types(node).items():  # a value override of a choice key
        require(isinstance(node[key], DictConfig) and OmegaConf.get_type(node[key]) is cls,
                f"{key}: its kind changed by a value override; choose it with the config group "
                f"({key}=<option>), not with a key inside it")
    try:
        # OmegaConf's to_object is typed loosely: a node typed as RunConfig (`_typed`) becomes a RunConfig.
        run = cast(RunConfig, OmegaConf.to_object(node))
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key}: missing; set it in conf/ or on the command line "
                          f"({e.full_key}=<value>)") from None
    except OmegaConfBaseException as e:
        raise ConfigError(_schema_message(e)) from None
    run = with_derived(run)
    validate(run)
    check_adaptive_metric(run)
    return run


def check_adaptive_metric(run: RunConfig) -> None:
    """adaptive.metric, and each metric of adaptive.seed_sd, must be an outcome that train or an
    evaluation of eval.jobs records on this run: the jobs declare them, so this check is made here,
    where the jobs are known."""
    recorded = sorted(set().union(*(job.outcomes() for job in recording_jobs(run))))
    for metric in sorted(run.adaptive.seed_sd):
        require(metric in recorded, f"adaptive.seed_sd.{metric}: not a metric of this sweep; choose among: "
                f"{', '.join(recorded)} (the metrics of train and eval.jobs)")
    if run.adaptive.metric is None:
        return
    require(run.adaptive.metric in recorded, f"adaptive.metric={run.adaptive.metric}: not allowed; choose one "
            f"of: {', '.join(recorded)} (the metrics of train and eval.jobs)")


# ---------------------------------------------------------------------------------------------
# Errors as one line

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


def _override_message(e: Exception) -> str:
    unknown = re.match(r"Could not override '([^']+)'", str(e))
    if unknown and "To append to your config" in str(e):
        return f"{unknown.group(1)}: unknown key; check the spelling (see conf/ and the section's config class)"
    if isinstance(e.__cause__, OmegaConfBaseException):  # a value the schema refuses
        return _schema_message(e.__cause__)
    return _first_line(e)


def _schema_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or "config"
    msg = str(e).splitlines()[0]
    if "not in" in msg:
        return f"{key}: unknown key; check the spelling (see conf/ and the section's config class)"
    m = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if m:
        value, _, wanted = m.groups()
        return f"{key}={value}: expected {wanted.lower()}, got {value!r}"
    m = re.search(r"(\w+) is not a subclass of (\w+)", msg)
    if m:
        section_name = key.split(".")[0] if key != "config" else m.group(2).lower()
        return (f"{section_name}: is a config section, not a {m.group(1)}; set one of its keys "
                f"({section_name}.<key>=...)")
    return f"{key}: {msg}"
