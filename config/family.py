"""family: which model family a run trains, with its settings (conf/family/*.yaml), by
`family.name`. How a family lays out, stages and grows its network is its behaviour
(jobs/families/, registered under the same name):

dense:  L layers applied once each.
looped: prelude, a block of k layers applied `loops` times, coda.
lidas:  starts shallow and grows by one block per stage (Layer-wise Insertion at the middle).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.registry import Registry
from common.settings import require, section, setting

if TYPE_CHECKING:
    from config.run import JobConfig

# A section's derived values: field name -> its new value (of that field's type).
Derived = dict[str, object]


@dataclass(frozen=True)
class FamilyConfig:
    """What every family has; each family subclasses it with its own settings."""
    name: str = setting()

    def derive(self, run: JobConfig) -> Derived:
        """This section's fields to replace by values derived from the rest of `run` (read-only),
        before validation; the composer applies them."""
        return {}


FAMILY_CONFIGS: Registry[type[FamilyConfig]] = Registry("family", "config.family", "family.name")


@FAMILY_CONFIGS.register("dense")
@dataclass(frozen=True)
class DenseConfig(FamilyConfig):
    """L unique layers applied once each: nothing to set."""


@dataclass(frozen=True)
class GrowthConfig:
    block_layers: Optional[int] = setting(gt=0)  # null = model.block_size
    initial_blocks: int = setting(gt=0)
    alpha: float = setting(ge=0)
    optimizer_state: str = setting(choices=("copy", "reset"))  # copy: new layers take their source's AdamW moments


@FAMILY_CONFIGS.register("lidas")
@dataclass(frozen=True)
class LidasConfig(FamilyConfig):
    """Start with `initial_blocks` blocks of `block_layers` layers; grow by one block per stage
    until model.n_layers. Stage i (i blocks) trains for a share of train.steps proportional to
    i**alpha (Prop-alpha)."""
    growth: GrowthConfig = section(GrowthConfig)

    def derive(self, run: JobConfig) -> Derived:
        if self.growth.block_layers is not None:
            return {}
        return {"growth": dataclasses.replace(self.growth, block_layers=run.model.block_size)}

    @property
    def block_layers(self) -> int:
        """growth.block_layers, derived (never null once composed)."""
        assert self.growth.block_layers is not None, "derive() fills growth.block_layers"
        return self.growth.block_layers

    def check(self, run: JobConfig) -> None:
        b, n0, n = self.block_layers, self.growth.initial_blocks, run.model.n_layers
        require(n % b == 0, f"family.growth.block_layers={b}: must divide model.n_layers={n}")
        require(n0 < n // b, f"family.growth.initial_blocks={n0}: the schedule does not grow (final "
                f"depth {n} = {n // b} blocks of {b}); use fewer initial blocks")
        stages = n // b - n0 + 1
        require(run.train.steps >= stages, f"train.steps={run.train.steps}: fewer than the {stages} "
                f"growth stages; raise train.steps")


@dataclass(frozen=True)
class LoopConfig:
    """null = derived from the size: block = model.block_size, prelude = coda = block // 2,
    loops = (n_layers - prelude - coda) / block."""
    prelude_layers: Optional[int] = setting(ge=0)
    block_layers: Optional[int] = setting(gt=0)
    loops: Optional[int] = setting()
    coda_layers: Optional[int] = setting(ge=0)


@FAMILY_CONFIGS.register("looped")
@dataclass(frozen=True)
class LoopedConfig(FamilyConfig):
    """A prelude, a block of k unique layers applied `loops` times, a coda. Effective depth
    prelude + k x loops + coda; with the defaults it equals the size's n_layers, so a looped
    model costs the same FLOPs per token as the dense one with fewer unique parameters."""
    loop: LoopConfig = section(LoopConfig)

    def derive(self, run: JobConfig) -> Derived:
        lp, model = self.loop, run.model
        block = model.block_size if lp.block_layers is None else lp.block_layers
        edge = block // 2
        prelude = edge if lp.prelude_layers is None else lp.prelude_layers
        coda = edge if lp.coda_layers is None else lp.coda_layers
        loops = lp.loops
        if loops is None and block > 0:
            loops = (model.n_layers - prelude - coda) // block
        return {"loop": LoopConfig(prelude_layers=prelude, block_layers=block, loops=loops, coda_layers=coda)}

    @property
    def layers(self) -> tuple[int, int, int, int]:
        """(prelude, block, loops, coda), derived (never null once composed)."""
        lp = self.loop
        assert None not in (lp.prelude_layers, lp.block_layers, lp.loops, lp.coda_layers), "derive() fills them"
        return lp.prelude_layers, lp.block_layers, lp.loops, lp.coda_layers  # type: ignore[return-value]

    def check(self, run: JobConfig) -> None:
        (e, k, r, dd), n = self.layers, run.model.n_layers
        require(k + e + dd <= n, f"family.loop.block_layers={k}: block plus prelude and coda "
                f"({k + e + dd} layers) exceed model.n_layers={n}")
        require(r >= 2, f"family.loop.loops={r}: a looped model needs loops >= 2 (set "
                f"family.loop.loops or a smaller family.loop.block_layers)")
        require(e + k * r + dd == n, f"family.loop: prelude {e} + block {k} x loops {r} + coda {dd} = "
                f"{e + k * r + dd} layers, but model.n_layers={n}; make them equal (same per-token "
                f"FLOPs as dense)")
