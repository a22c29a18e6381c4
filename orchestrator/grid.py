"""Grid expansion with Hydra's own override grammar (sweeps, range(), glob(), +key=, group choices).

The command-line overrides are merged with the default grid of `hydra.sweeper.params` in
conf/config.yaml exactly as Hydra's basic sweeper does (a key given on the command line replaces
the default axis), and the cartesian product of the swept keys gives one override list per run.
One addition: a command line that gives `init_seed` or `data_seed` replaces the default `seed`
axis too (the seed stays at conf/config.yaml's), so `init_seed=0,1 data_seed=0,1` is 4 runs, not
4 at each default seed; give `seed=` as well to cross all three."""
from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass

import yaml
from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException

from orchestrator import config
from orchestrator.config import ConfigError, RunConfig, compose_runs, hydra_session, yaml_message


@dataclass(frozen=True)
class GridPoint:
    overrides: tuple[str, ...]
    config: RunConfig


def _parse(overrides: list[str]) -> list:
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    try:
        return parser.parse_overrides(overrides)
    except OverrideParseException as e:
        bad = next((o for o in overrides if _fails(parser, o)), " ".join(overrides))
        raise ConfigError(f"malformed override {bad!r}: {str(e).splitlines()[0]} "
                          f"(grammar: key=value, key=a,b, key=range(0,5), group=glob(*))") from None


def _fails(parser: OverridesParser, override: str) -> bool:
    try:
        parser.parse_overrides([override])
        return False
    except OverrideParseException:
        return True


# `seed=0..2`: a range as other tools spell it, which Hydra reads as the string '0..2'
DOTTED_RANGE = re.compile(r"([^=]+)=(-?[0-9]+)\.\.(-?[0-9]+)")


def _refuse_foreign_habits(cli_overrides: list[str]) -> None:
    """Spellings that parse, but not as meant: `a..b` ranges, and Hydra's runtime settings
    (hydra.job.chdir, hydra.run.dir, ...), which this orchestrator never applies: every file it
    writes is under store.root and it never changes directory."""
    for o in cli_overrides:
        if m := DOTTED_RANGE.fullmatch(o):
            key, first, last = m.group(1), int(m.group(2)), int(m.group(3))
            raise ConfigError(f"{o}: Hydra has no a..b ranges; write {key}='range({first},{last + 1})' "
                              f"(quoted for the shell; the end is exclusive)")
        if re.split(r"[./=]", o.lstrip("+~"), maxsplit=1)[0] == "hydra":
            raise ConfigError(f"{o}: Hydra's runtime settings (hydra.*) do not apply here: every file "
                              f"goes under store.root and the working directory never changes; drop it "
                              f"(store.root=<dir> chooses where files go)")


# hydra.sweeper.params by digest of the config sources: reading it composes Hydra's own config too
# (~0.3 s), once per conf/ content in a process.
_DEFAULT_GRIDS: dict[str, dict[str, str]] = {}


def default_grid() -> dict[str, str]:
    """The default grid of conf/ (`hydra.sweeper.params`): key -> Hydra sweep string."""
    sources = config.sources_digest()
    if sources not in _DEFAULT_GRIDS:
        try:
            params = compose("config", return_hydra_config=True).hydra.sweeper.params or {}
        except yaml.YAMLError as e:
            raise ConfigError(yaml_message(e)) from None
        _DEFAULT_GRIDS[sources] = {str(k): str(v) for k, v in params.items()}
    return dict(_DEFAULT_GRIDS[sources])


def axes(cli_overrides: list[str]) -> dict[str, list[str]]:
    """key -> list of `key=value` strings, default grid first, command line replacing it."""
    _refuse_foreign_habits(cli_overrides)
    default = default_grid()
    merged: dict[str, list[str]] = {}
    groups = {p.name for p in config.CONF_DIR.iterdir() if p.is_dir()}
    given = _parse(cli_overrides)
    if {o.key_or_group for o in given} & set(SEED_KEYS[1:]):
        default = {k: v for k, v in default.items() if k != "seed"}
    for o in _parse([f"{k}={v}" for k, v in default.items()]) + given:
        key = o.get_key_element()
        if not o.key_or_group:
            raise ConfigError(f"malformed override {o.input_line!r}: no key before '='; write key=value")
        if o.key_or_group in groups and isinstance(o.value(), list):
            raise ConfigError(f"{o.input_line}: a list of {o.key_or_group} options; choose one "
                              f"({o.key_or_group}=<option>) or sweep them ({o.key_or_group}=a,b)")
        if o.is_sweep_override():
            try:
                values = list(o.sweep_string_iterator())
            except HydraException as e:
                raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from None
            if not values:
                raise ConfigError(f"{key}: the sweep is empty; give at least one value")
            merged[key] = [f"{key}={v}" for v in values]
        else:
            merged[key] = [f"{key}={o.get_value_element_as_str()}"]
    return merged


def expand(cli_overrides: list[str]) -> tuple[list[GridPoint], str]:
    """All grid points, validated, and the default sweep name derived from the grid."""
    with hydra_session():
        grid = axes(cli_overrides)
        combos = list(itertools.product(*grid.values()))
        points = [GridPoint(tuple(combo), cfg)
                  for combo, cfg in zip(combos, compose_runs([list(c) for c in combos]))]
    return points, default_sweep_name(grid)


# Where a sweep runs, is stored and tracked does not name it, nor the seed noise its dry run plans with.
NOT_IN_NAME = ("store.", "cluster", "tracker", "adaptive.seed_sd")
# The seeds: other seeds extend a sweep (its runs are replicates of the same cells).
SEED_KEYS = ("seed", "init_seed", "data_seed")
MAX_NAME = 120  # characters of a sweep name (a directory under sweeps/)
HASH_CHARS = 8  # of a long name's hash


def named_axes(grid: dict[str, list[str]]) -> dict[str, list[str]]:
    """What names a sweep: every axis but the seeds (`SEED_KEYS`; and where it runs, is stored and
    tracked), key -> sorted distinct values, so `seed=3,4` (or `init_seed=2`) extends a sweep and
    `family=dense,lidas` and `family=lidas,dense` are one sweep."""
    return {key.lstrip("+~"): sorted({item.split("=", 1)[1] for item in items})
            for key, items in sorted(grid.items())
            if key.lstrip("+~") not in SEED_KEYS and not key.lstrip("+~").startswith(NOT_IN_NAME)}


def default_sweep_name(grid: dict[str, list[str]]) -> str:
    """A name from `named_axes`; one longer than MAX_NAME is cut and ends in a hash of the whole,
    so two long grids that share their first characters still name two sweeps."""
    name = "_".join(f"{key}-{'-'.join(values)}" for key, values in named_axes(grid).items()) or "default"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]
    return f"{name[:MAX_NAME - HASH_CHARS - 1].rstrip('._-')}-{digest}"


def named_axes_of(cli_overrides: list[str]) -> dict[str, list[str]]:
    """`named_axes` of a command line's grid (parsed only, nothing composed), e.g. of the
    overrides a sweep was recorded with."""
    with hydra_session():
        return named_axes(axes(cli_overrides))
