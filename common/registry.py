"""Components by name: families, evaluations, backends, data kinds and cluster kinds.

Each kind of component has one `Registry` for its config classes (config/, by the choice that
names them: `family.name`, `data.kind`, ...) and one for its behaviour (jobs/, orchestrator/),
keyed by the same name. A component registers itself where it is defined
(`@FAMILY_CONFIGS.register("lidas")`), and a registry imports its module, or every module of its
package, the first time it is asked, so adding a component is adding a file. Modules outside the project that
register components (your own evaluation, a test's) are named in $ORCHESTRATOR_PLUGINS
(comma-separated module names), which Ray workers and launched ranks inherit.
"""
from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
from collections.abc import Callable
from typing import Generic, TypeVar

from common.settings import ConfigError

T = TypeVar("T")
PLUGINS_ENV = "ORCHESTRATOR_PLUGINS"


class Registry(Generic[T]):
    """Name -> component of one kind, filled by the modules of `package` (and the plugins)."""

    def __init__(self, kind: str, package: str, key: str):
        self.kind, self.package, self.key = kind, package, key  # key: the config key that names one
        self._items: dict[str, T] = {}
        self._discovered = False

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items and self._items[name] is not item:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = item
            return item
        return add

    def _discover(self) -> None:
        """Import the package's modules and the plugins, once all of them imported: a module that
        fails to import fails every lookup with its error, never leaves a registry that lacks it
        (a long-lived worker whose code changed under it would otherwise say "no such ...")."""
        if self._discovered:
            return
        package = importlib.import_module(self.package)  # a package: each of its modules too
        for module in pkgutil.iter_modules(getattr(package, "__path__", [])):
            importlib.import_module(f"{self.package}.{module.name}")
        for plugin in filter(None, os.environ.get(PLUGINS_ENV, "").split(",")):
            importlib.import_module(plugin.strip())
        self._discovered = True

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._items

    def __getitem__(self, name: str) -> T:
        """The component, or a ConfigError naming the key, the known names and the nearest one."""
        self._discover()
        if name not in self._items:
            near = difflib.get_close_matches(str(name), self._items, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            article = "an" if self.kind[0] in "aeiou" else "a"
            raise ConfigError(f"{self.key}={name}: no such {self.kind}{hint}; choose one of: "
                              f"{', '.join(self.names())} ({article} {self.kind} is {self._home()})")
        return self._items[name]

    def _home(self) -> str:
        path = self.package.replace(".", "/")
        package = importlib.import_module(self.package)
        return f"a file in {path}/" if hasattr(package, "__path__") else f"registered in {path}.py"

    def items(self) -> list[tuple[str, T]]:
        self._discover()
        return sorted(self._items.items())
