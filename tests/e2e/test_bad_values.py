"""Every declared config key, given generated bad values (of the wrong type, out of its declared
bounds, NaN, infinite, an empty or short list, an unknown choice), is refused by `sweep --dry-run`
and by the real `sweep` alike: exit 2, exactly one line on stderr (no traceback), and a store
that did not exist still does not. The keys come from walking the config classes of composed
configs (each family's sections), so a key added later is covered without a change here.

The CLI runs in-process (`main`), each case as a user's command line would: the dry run, then
the real run. Hydra's composition of the config groups (the same choices in every case; the
values are overrides applied after it) is memoized for the module, which makes a case a tenth
of a second instead of two: it is deterministic for the same choices and conf/."""
import copy
import dataclasses
import typing
from typing import Any, Iterator

import pytest
from omegaconf import OmegaConf

from orchestrator import config, grid

from common.settings import CONSTRAINTS, Constraints
from orchestrator.cli import main
from orchestrator.config import compose_run, hydra_session

BASES = {"lidas": ["size=micro", "family=lidas", "seed=0"], "looped": ["size=micro", "family=looped", "seed=0"]}


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any, Constraints]]:
    """(dotted key, type, constraints) of every scalar or list field under `node`."""
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{key}.")
            continue
        kind = hints[f.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) is typing.Union and len(args) == 1:  # Optional[x]
            kind = args[0]
        yield key, kind, f.metadata.get(CONSTRAINTS, Constraints())


def _broken_bound(c: Constraints, integer: bool) -> list[str]:
    """A value just outside each declared bound."""
    step = 1 if integer else 0.5
    outside = [c.ge - step if c.ge is not None else None, c.gt, c.le + step if c.le is not None else None, c.lt]
    return [str(int(v) if integer else float(v)) for v in outside if v is not None]


def bad_values(kind: Any, c: Constraints) -> list[str]:
    if kind is bool:
        return ["maybe"]
    if kind is int:
        return ["abc", "1.5", *_broken_bound(c, True)]
    if kind is float:
        return ["abc", "nan", "1e400", *_broken_bound(c, False)] if c.finite else ["abc", *_broken_bound(c, False)]
    if kind is str:
        return ["nope"] if c.choices else []  # any text is a string
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        values = ["[]"] if c.nonempty else []
        if c.length:
            values.append("[" + ",".join(["1"] * (c.length + 1)) + "]")
        if item in (int, float):
            values += ["[abc]"] + [f"[{v}]" if not c.length else "[" + ",".join([v] * c.length) + "]"
                                   for v in _broken_bound(c, item is int)]
        return values
    return []  # a section chosen whole (Optional[dataclass]) or a mapping: not a value


def cases() -> list[tuple[str, str, str]]:
    with hydra_session():
        configs = {name: compose_run(base) for name, base in BASES.items()}
    seen, out = set(), []
    for name, cfg in configs.items():
        for key, kind, c in _leaves(cfg):
            if key in seen:
                continue
            seen.add(key)
            out += [(name, key, value) for value in bad_values(kind, c)]
    return out


CASES = cases()


@pytest.fixture(scope="module", autouse=True)
def composed_once():
    """Hydra's compose, remembered by its arguments (copies handed out: callers change them)."""
    compose, memo = config.compose, {}

    def remembered(name: str, overrides: tuple = (), **kwargs: Any):
        key = (name, tuple(overrides), tuple(sorted(kwargs.items())))
        if key not in memo:
            memo[key] = compose(name, overrides=list(overrides), **kwargs)
        node = copy.deepcopy(memo[key])
        OmegaConf.set_readonly(node, False)
        return node

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config, "compose", remembered)
        patch.setattr(grid, "compose", remembered)
        yield


@pytest.mark.parametrize("base, key, value", CASES, ids=[f"{k}={v}" for _, k, v in CASES])
def test_a_bad_value_of_any_key_is_one_line_and_writes_nothing(base, key, value, tmp_path, capsys):
    root = tmp_path / "store"
    for mode in (["--dry-run"], []):
        try:
            code = main(["sweep", *mode, *BASES[base], f"{key}={value}", f"store.root={root}"])
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        lines = [line for line in out.err.splitlines() if line.strip()]
        assert (code, len(lines)) == (2, 1), (mode, out.out[-2000:], out.err[-2000:])
        assert lines[0].startswith("error: ") and "Traceback" not in out.out + out.err
        assert not root.exists()


def test_every_declared_key_is_covered():
    assert len({key for _, key, _ in CASES}) > 60


@pytest.mark.parametrize("override", ["train.lr=nan", "eval.jobs=[]"])
def test_as_a_process_the_line_is_alone_on_stderr(override, tmp_path):
    """The same through `python -m orchestrator`, as a shell runs it (Python's own start-up and
    exit, the real streams)."""
    import subprocess
    import sys

    root = tmp_path / "store"
    for mode in (["--dry-run"], []):
        done = subprocess.run([sys.executable, "-m", "orchestrator", "sweep", *mode, *BASES["lidas"], override,
                               f"store.root={root}"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and done.stdout == "", (mode, done.stdout, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
        assert not root.exists()
