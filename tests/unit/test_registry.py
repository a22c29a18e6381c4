"""common/registry.py: components found by importing every module of their package, once."""
import sys
import textwrap

import pytest

from common.registry import Registry
from common.settings import ConfigError


def package(root, name: str, modules: dict[str, str]) -> None:
    """A package `name` under `root` whose modules register into `test_registry_target.ITEMS`."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    for module, body in modules.items():
        (root / name / f"{module}.py").write_text(textwrap.dedent(body))


def test_a_module_that_fails_to_import_fails_every_lookup_never_a_partial_registry(tmp_path, monkeypatch):
    """A module of the package that cannot be imported (code changed under a long-lived worker, say)
    raises its error at each lookup; once it imports, every component is there."""
    monkeypatch.syspath_prepend(str(tmp_path))
    items: Registry[str] = Registry("widget", "widgets_pkg", "widget.name")
    monkeypatch.setitem(sys.modules, "test_registry_target", type(sys)("test_registry_target"))
    sys.modules["test_registry_target"].ITEMS = items
    register = "from test_registry_target import ITEMS\nITEMS.register({name!r})({name!r})\n"
    package(tmp_path, "widgets_pkg", {"a": register.format(name="a"), "b": "raise TypeError('b is broken')\n",
                                      "c": register.format(name="c")})
    for _ in range(2):
        with pytest.raises(TypeError, match="b is broken"):
            items.names()
        with pytest.raises(TypeError, match="b is broken"):
            items["c"]
    (tmp_path / "widgets_pkg" / "b.py").write_text(register.format(name="b"))
    sys.modules.pop("widgets_pkg.b", None)  # its failed import left nothing; the fixed file is read anew
    assert items.names() == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="widget.name=d: no such widget"):
        items["d"]
    for module in [m for m in sys.modules if m.split(".")[0] == "widgets_pkg"]:
        del sys.modules[module]
