"""Typed settings with their constraints declared on the fields, checked in one place.

A component declares its config as a dataclass; each field says its type and what values it
allows, e.g.

    @dataclass(frozen=True)
    class TrainConfig:
        steps: int = setting(gt=0)
        lr: float = setting(gt=0)
        warmup_steps: int = setting(ge=0)

        def check(self, run) -> None:  # rules across fields, given the whole run config
            require(self.warmup_steps < self.steps, f"train.warmup_steps={self.warmup_steps}: ...")

`validate(run)` walks the config: every numeric field is finite unless declared otherwise, each
declared bound, choice, length and order is checked, then every section's `check(run)`. A
violation is one `ConfigError` line naming the key, the value and what is allowed.

Defaults live in conf/ (Hydra's config groups), not here: a field without a default is
`MISSING` until composition fills it. A field may carry a default only where conf/ does not set
it (tests/unit/test_config.py checks that both never disagree).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, TypeVar, cast

from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

CONSTRAINTS = "constraints"  # the field metadata key
T = TypeVar("T")


class ConfigError(ValueError):
    """A user mistake in the config or the overrides; its message is one line with the fix."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class Constraints:
    """What a field allows. Numeric bounds and `finite` apply to a number or to each item of a list."""
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None
    lt: Optional[float] = None
    choices: Optional[tuple] = None
    finite: bool = True
    length: Optional[int] = None       # a list of exactly this many items
    nonempty: bool = False             # a list with at least one item
    ascending: bool = False            # a list in non-decreasing order, e.g. a [low, high] range
    what: str = ""                     # how to say what is allowed, instead of the bounds

    def problem(self, value: Any) -> Optional[str]:
        """Why `value` is not allowed, or None."""
        if isinstance(value, (list, tuple)):
            if self.length is not None and len(value) != self.length:
                return self.what or f"must have {self.length} items"
            if self.nonempty and not value:
                return self.what or "must not be empty"
            if self.ascending and any(a > b for a, b in zip(value, value[1:])):
                return self.what or "must be in ascending order"
            return next((why for item in value if (why := self.problem(item))), None)
        if self.choices is not None and value not in self.choices:
            return f"not allowed; choose one of: {', '.join(map(str, self.choices))}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if self.finite and not math.isfinite(value):
            return self.what or "must be a finite number"
        bounds = [(self.ge, ">=", value >= (self.ge or 0)), (self.gt, ">", value > (self.gt or 0)),
                  (self.le, "<=", value <= (self.le or 0)), (self.lt, "<", value < (self.lt or 0))]
        broken = [f"{sign} {bound:g}" for bound, sign, ok in bounds if bound is not None and not ok]
        if broken:
            return f"must be {self.what}" if self.what else f"must be {' and '.join(broken)}"
        return None


def setting(default: Any = MISSING, *, factory: Any = None, ge: Optional[float] = None,
            gt: Optional[float] = None, le: Optional[float] = None, lt: Optional[float] = None,
            choices: Optional[Sequence] = None, finite: bool = True, length: Optional[int] = None,
            nonempty: bool = False, ascending: bool = False, what: str = "") -> Any:
    """A dataclass field with its constraints; MISSING (set in conf/) unless a default is given."""
    constraints = Constraints(ge, gt, le, lt, None if choices is None else tuple(choices), finite,
                              length, nonempty, ascending, what)
    if factory is not None:
        return field(default_factory=factory, metadata={CONSTRAINTS: constraints})
    return field(default=default, metadata={CONSTRAINTS: constraints})


def section(cls: type) -> Any:
    """A nested config section (a dataclass), filled by composition."""
    return field(default_factory=cls)


def validate(run: Any) -> None:
    """Check every declared constraint of `run` (a config dataclass tree), then each section's
    cross-field `check(run)`, outermost first; raises ConfigError on the first violation."""
    sections: list[Any] = []
    _walk(run, "", sections)
    for node in sections:
        node.check(run)


def validate_field(node: Any, name: str, value: Any) -> None:
    """Check `value` against the declared constraints of field `name` of `node` (a dataclass), as
    `validate` would: a config that changes in one leaf is checked without walking it all."""
    constraints = node.__dataclass_fields__[name].metadata.get(CONSTRAINTS, Constraints())
    if value is not None and (why := constraints.problem(value)):
        raise ConfigError(f"{name}={_text(value)}: {why}")


def _walk(node: Any, prefix: str, sections: list[Any]) -> None:
    if hasattr(node, "check"):
        sections.append(node)
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _walk(value, f"{key}.", sections)
            continue
        constraints = f.metadata.get(CONSTRAINTS, Constraints())
        if value is not None and (why := constraints.problem(value)):
            raise ConfigError(f"{key}={_text(value)}: {why}")


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(_text, value)) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def defaults(cls: type) -> dict[str, Any]:
    """The defaults a config class declares itself (fields not left to conf/), by field name;
    nested sections as dicts."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = defaults(type(value)) if dataclasses.is_dataclass(value) else value
        elif f.default is not dataclasses.MISSING and f.default is not MISSING:
            out[f.name] = f.default
    return out


def typed_node(root: type, raw: Any) -> DictConfig:
    """`raw` (a composed DictConfig or a dict) merged into the structured schema of `root`, each
    section as the class `root.section_types(raw)` chooses for it: keys and types are checked
    (OmegaConf raises on an unknown key or a value of the wrong type), and stay checked for
    later assignments."""
    node = OmegaConf.structured(root)
    _writable(node)
    for key, cls in (root.section_types(raw) if hasattr(root, "section_types") else {}).items():
        node[key] = OmegaConf.structured(cls)
    _writable(node)
    merged = OmegaConf.merge(node, raw)
    assert isinstance(merged, DictConfig), "merged into a structured dataclass node: a DictConfig"
    return merged


def _writable(node: Any) -> None:
    """Clear the read-only flag OmegaConf sets on the nodes of a frozen dataclass: composition
    fills and overrides them; `OmegaConf.to_object` makes the frozen objects."""
    node._set_flag("readonly", None)
    if isinstance(node, (DictConfig, ListConfig)) and not node._is_none() and not node._is_missing():
        if isinstance(node, DictConfig):
            for key in node.keys():
                _writable(node._get_node(key))
        else:
            for index in range(len(node)):
                _writable(node._get_node(index))


def from_dict(root: type[T], raw: Any) -> T:
    """The typed config (an instance of `root`) of a resolved config dict, e.g. a stored one."""
    # OmegaConf is untyped here: to_object of a structured node builds an instance of its class, `root`.
    return cast(T, OmegaConf.to_object(typed_node(root, raw)))


def known_part(cls: type, raw: Any) -> Any:
    """`raw` without the keys that the classes of `cls` (sections chosen as `typed_node` chooses
    them) do not have: a stored config written by an earlier version loads with today's classes."""
    if not (dataclasses.is_dataclass(cls) and isinstance(raw, dict)):
        return raw
    chosen = cls.section_types(raw) if hasattr(cls, "section_types") else {}
    hints = typing.get_type_hints(cls)
    return {f.name: known_part(chosen.get(f.name) or _dataclass_in(hints.get(f.name)), raw[f.name])
            for f in dataclasses.fields(cls) if f.name in raw}


def _dataclass_in(hint: Any) -> Any:
    """The dataclass of a field's type hint (also inside Optional[...]), or None."""
    if dataclasses.is_dataclass(hint):
        return hint
    return next((a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)), None)


def to_dict(config: Any) -> dict[str, Any]:
    """The plain dict of a typed config: what config.yaml holds and the run id is computed from."""
    return dataclasses.asdict(config)
