"""looped: a prelude, a block of k unique layers applied `loops` times, a coda. Effective depth
prelude + k x loops + coda; with the defaults it equals the size's n_layers, so a looped model
costs the same FLOPs per token as the dense one with fewer unique parameters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from common.settings import require, section, setting
from jobs.families import FAMILIES, FamilyConfig
from jobs.model import ModelConfig


@dataclass
class LoopConfig:
    """null = derived from the size: block = model.block_size, prelude = coda = block // 2,
    loops = (n_layers - prelude - coda) / block."""
    prelude_layers: Optional[int] = setting(ge=0)
    block_layers: Optional[int] = setting(gt=0)
    loops: Optional[int] = setting()
    coda_layers: Optional[int] = setting(ge=0)

    def counts(self) -> tuple[int, int, int, int]:
        """(prelude, block, loops, coda) once `LoopedConfig.derive` has filled in the nulls."""
        prelude, block, loops, coda = self.prelude_layers, self.block_layers, self.loops, self.coda_layers
        assert prelude is not None and block is not None and loops is not None and coda is not None, \
            "family.loop is read before derive()"
        return prelude, block, loops, coda


@FAMILIES.register("looped")
@dataclass
class LoopedConfig(FamilyConfig):
    loop: LoopConfig = section(LoopConfig)

    def derive(self, run: Any) -> None:
        lp, model = self.loop, run.model
        lp.block_layers = model.block_size if lp.block_layers is None else lp.block_layers
        edge = lp.block_layers // 2
        lp.prelude_layers = edge if lp.prelude_layers is None else lp.prelude_layers
        lp.coda_layers = edge if lp.coda_layers is None else lp.coda_layers
        if lp.loops is None and lp.block_layers > 0:
            lp.loops = (model.n_layers - lp.prelude_layers - lp.coda_layers) // lp.block_layers

    def check(self, run: Any) -> None:
        (e, k, r, dd), n = self.loop.counts(), run.model.n_layers
        require(k + e + dd <= n, f"family.loop.block_layers={k}: block plus prelude and coda "
                f"({k + e + dd} layers) exceed model.n_layers={n}")
        require(r >= 2, f"family.loop.loops={r}: a looped model needs loops >= 2 (set "
                f"family.loop.loops or a smaller family.loop.block_layers)")
        require(e + k * r + dd == n, f"family.loop: prelude {e} + block {k} x loops {r} + coda {dd} = "
                f"{e + k * r + dd} layers, but model.n_layers={n}; make them equal (same per-token "
                f"FLOPs as dense)")

    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        prelude, block, loops, coda = self.loop.counts()
        plan = (list(range(prelude)) + list(range(prelude, prelude + block)) * loops
                + list(range(prelude + block, prelude + block + coda)))
        return prelude + block + coda, plan
