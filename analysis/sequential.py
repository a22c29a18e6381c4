"""Adding seeds until decisive: the pre-declared group-sequential stopping rule (docs/statistics.md, f).

Re-testing at 95% after every new seed and stopping when the interval excludes 0 inflates the
false-positive rate, so seeds are added in a declared schedule of looks (default n = 3, 5, 8; K = 3,
S_max = 8) and every look tests at 1 - alpha/K (Bonferroni over looks, valid under any dependence),
with Holm across the confirmatory cells on top. Estimates from an early stop are biased away from 0
(winner's curse).

A comparison that is decided stays decided: the verdicts settled at earlier looks are passed back in
(`settled`, keyed by `comparison_key`) and kept, with the look that settled them (settled_at_look), and
new seeds go only to the arms (family, size, cell-key values) of comparisons still open, plus the
baseline they are compared with (`SeedPlan.open_arms`). `SeedPlan.to_record` / `SeedPlan.from_record`
turn a plan into plain YAML-able data and back, for the sweep's record of its looks;
`settled_verdicts` collects the settled verdicts from such records.

Why the error rate holds: at look k every comparison still open has exactly looks[k-1] seeds (a
fixed-n test), and Holm runs over all m comparisons with the settled ones entered at p = 1, which can
only remove rejections from Holm over all m fixed-n p-values; so each look falsely rejects with
probability at most alpha / K, and the K looks together at most alpha.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.stats import (BETTER, DECIDED, EQUIVALENT_VERDICTS, NEGLIGIBLE, WORSE, PrimaryMetrics, cell_keys,
                            compare, confirmatory_metrics, holm, seeds_needed, verdict_rule)

SETTLED = DECIDED  # compare's verdicts that end a comparison: better, worse, equivalent (either kind)
FUTILE, CONTINUE, INCONCLUSIVE = "futile", "continue", "inconclusive"
FINAL = (*SETTLED, FUTILE)  # the verdicts that stay settled at later looks
SEQUENTIAL_VERDICTS = (*SETTLED, FUTILE, CONTINUE, INCONCLUSIVE)
# The columns of a comparison kept in a plan's record (besides its key and verdict).
RECORD_COLUMNS = ("baseline", "n_pairs", "diff_mean", "ci_low", "ci_high", "p_value", "p_holm",
                  "seeds_to_decide", "n_more")

Cell = tuple  # ((config key, value), ...) in the order of the cell keys; () without cell keys
ArmKey = tuple  # (family, size, Cell)
ComparisonKey = tuple  # (family, size, Cell, metric)


def _plain(value: object) -> object:
    """A value as plain YAML-able Python: numpy scalars unwrapped, NaN / NA as None."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def cell_of(row: Mapping, keys: Sequence[str]) -> Cell:
    """The cell-key values of a comparison row as ((key, value), ...), with NaN as None."""
    return tuple((str(k), _plain(row[k])) for k in keys)


def comparison_key(family: str, size: object, cell: Cell | Mapping = (), metric: str = "") -> ComparisonKey:
    """The stable key of one comparison: (family, size, ((cell key, value), ...), metric). `cell` may be
    a mapping key -> value; values are plain Python (NaN as None), so a key read back from YAML equals
    the one built from the table (1 == 1.0 in Python)."""
    pairs = cell.items() if isinstance(cell, Mapping) else cell
    return (str(family), _plain(size), tuple((str(k), _plain(v)) for k, v in pairs), str(metric))


def arm_key(family: str, size: object, cell: Cell | Mapping = ()) -> ArmKey:
    """The stable key of one arm, a (family, size, cell-key values) that runs seeds: the comparison key
    without the metric."""
    return comparison_key(family, size, cell)[:3]


def _row_key(row: Mapping, keys: Sequence[str]) -> ComparisonKey:
    return comparison_key(row["family"], row["size"], cell_of(row, keys), row["metric"])


@dataclass(frozen=True)
class SeedPlan:
    """The decision at the current look: continue (add n_more seeds to each arm in open_arms to reach
    the next look), stop (decisive, equivalent or futile), or inconclusive once S_max is reached with
    comparisons open.

    open_arms: the arms (family, size, cell) that get the new seeds: those of every comparison still
    `continue`, plus the baseline arm at the same size and cell-key values; empty unless continuing.
    runs_saved: the runs this look does not start because their arm is settled (n_more per arm with
    a comparison and not open). cell_keys: the config keys that split cells, in order.
    """
    decision: str
    n_more: int
    look: int  # k of n_looks; 0 before the first look
    n_looks: int
    n_seeds: int  # distinct seeds with results so far
    level: float  # 1 - alpha / n_looks, the level of every interval
    comparisons: pd.DataFrame
    open_arms: tuple = ()
    cell_keys: tuple = ()
    runs_saved: int = 0

    def needs_seeds(self, family: str, size: object, cell: Cell | Mapping = ()) -> bool:
        """Whether the arm (family, size, cell-key values) gets the next n_more seeds."""
        return arm_key(family, size, cell) in self.open_arms

    @property
    def settled(self) -> dict[ComparisonKey, tuple[str, int]]:
        """comparison key -> (verdict, settled_at_look) of every comparison settled so far: the mapping
        to pass as `settled` to the next look's `next_seeds`."""
        table = self.comparisons
        if "settled_at_look" not in table.columns:
            return {}
        rows = table[table["settled_at_look"].notna()]
        return {_row_key(row, self.cell_keys): (row["verdict"], int(row["settled_at_look"]))
                for _, row in rows.iterrows()}

    def to_record(self) -> dict:
        """The plan as plain data (dicts, lists, str, int, float, None) for yaml.safe_dump: the look's
        numbers, open_arms as {family, size, cell} and one entry per comparison with its key (family,
        size, cell: {config key: value}, metric), verdict, settled_at_look and RECORD_COLUMNS."""
        comparisons = []
        for _, row in self.comparisons.iterrows():
            comparisons.append({
                "family": _plain(row["family"]), "size": _plain(row["size"]),
                "cell": dict(cell_of(row, self.cell_keys)), "metric": _plain(row["metric"]),
                "verdict": row["verdict"], "settled_at_look": _plain(row.get("settled_at_look")),
                **{c: _plain(row[c]) for c in RECORD_COLUMNS if c in row.index}})
        return {"look": int(self.look), "n_looks": int(self.n_looks), "n_seeds": int(self.n_seeds),
                "level": float(self.level), "decision": self.decision, "n_more": int(self.n_more),
                "runs_saved": int(self.runs_saved), "cell_keys": list(self.cell_keys),
                "open_arms": [{"family": f, "size": s, "cell": dict(c)} for f, s, c in self.open_arms],
                "comparisons": comparisons}

    @classmethod
    def from_record(cls, record: Mapping) -> SeedPlan:
        """The plan of `to_record` read back: comparisons holds the recorded columns, with the cell
        keys as columns after size; settled and open_arms are as they were."""
        keys = tuple(record.get("cell_keys", ()))
        rows = [{"family": c["family"], "size": c["size"], **dict(c.get("cell") or {}), "metric": c["metric"],
                 **{k: v for k, v in c.items() if k not in ("family", "size", "cell", "metric")}}
                for c in record.get("comparisons", [])]
        table = pd.DataFrame(rows, columns=["family", "size", *keys, "metric", "verdict", "settled_at_look",
                                            *RECORD_COLUMNS] if not rows else None)
        if "settled_at_look" in table.columns:
            table["settled_at_look"] = table["settled_at_look"].astype("Int64")
        arms = tuple(arm_key(a["family"], a["size"], a.get("cell") or {}) for a in record.get("open_arms", []))
        return cls(decision=record["decision"], n_more=int(record["n_more"]), look=int(record["look"]),
                   n_looks=int(record["n_looks"]), n_seeds=int(record["n_seeds"]), level=float(record["level"]),
                   comparisons=table, open_arms=arms, cell_keys=keys, runs_saved=int(record.get("runs_saved", 0)))


def settled_verdicts(records: Mapping | SeedPlan | Iterable[Mapping | SeedPlan]
                     ) -> dict[ComparisonKey, tuple[str, int]]:
    """comparison key -> (verdict, look) from one plan record (`SeedPlan.to_record`) or a sequence of
    them in look order (a sweep's looks); the earliest settlement of a comparison wins. Pass the result
    as `settled` to `next_seeds`."""
    if isinstance(records, (Mapping, SeedPlan)):
        records = [records]
    settled: dict = {}
    for record in records:
        plan = record if isinstance(record, SeedPlan) else SeedPlan.from_record(record)
        for key, value in plan.settled.items():
            settled.setdefault(key, value)
    return settled


def plan_comparisons(record: Mapping) -> dict[str, dict]:
    """The comparisons of a plan's record (`SeedPlan.to_record`) by name: family/size, then each cell
    key=value ("lidas/tiny/train.lr=0.003"), so comparisons that differ only in a swept key such as
    train.lr are told apart in a look's verdicts."""
    return {"/".join([str(c["family"]), str(c["size"]), *(f"{k}={v}" for k, v in (c.get("cell") or {}).items())]): c
            for c in record.get("comparisons", [])}


# The rule's numbers that the report shows for a comparison it decided, from the deciding look's record.
DECIDING_COLUMNS = ("n_pairs", "diff_mean", "ci_low", "ci_high", "p_value")


def rule_decisions(looks: Sequence[Mapping]) -> dict[ComparisonKey, dict]:
    """comparison key -> what the adaptive rule concluded, from a sweep's recorded looks (sweep.yaml
    `looks`, each with its `plan`, `SeedPlan.to_record`): verdict, look (the look that settled it, or
    the last look for a comparison still open there), n_looks, level (that look's 1 - alpha/K), m (the
    comparisons in that look's Holm family), p_adj (the rule's Holm p at that look) and
    DECIDING_COLUMNS as the rule saw them at that look. A restart records a look again: the last
    record of each look counts. Empty when the sweep was not adaptive."""
    by_look = {int(look["look"]): look for look in looks if look.get("plan")}
    decisions: dict[ComparisonKey, dict] = {}
    for number in sorted(by_look):
        plan = by_look[number]["plan"]
        for c in plan["comparisons"]:
            key = comparison_key(c["family"], c["size"], c.get("cell") or {}, c["metric"])
            if key in decisions and decisions[key]["look"] == decisions[key].get("settled_at_look"):
                continue  # settled at an earlier look: that look's numbers stand
            decisions[key] = {"verdict": c["verdict"], "look": number, "settled_at_look": c.get("settled_at_look"),
                              "n_looks": int(plan["n_looks"]), "level": float(plan["level"]),
                              "m": len(plan["comparisons"]), "p_adj": c.get("p_holm"),
                              **{column: c.get(column) for column in DECIDING_COLUMNS}}
    return decisions


def _check_looks(looks: Sequence[int]) -> tuple[int, ...]:
    looks = tuple(int(n) for n in looks)
    if not looks or looks[0] < 2 or any(a >= b for a, b in zip(looks, looks[1:])):
        raise ValueError(f"looks must be increasing seed counts from 2 up, got {looks}")
    return looks


def _check_settled(settled: Mapping | None, look: int) -> dict:
    if not settled:
        return {}
    checked = {}
    for key, value in settled.items():
        verdict, at = value
        if verdict not in FINAL:
            raise ValueError(f"settled verdict of {key} must be one of {FINAL}, got {verdict!r}")
        if not 1 <= int(at) <= look:
            raise ValueError(f"{key} settled at look {at}, but this is look {look}")
        family, size, cell, metric = key
        checked[comparison_key(family, size, cell, metric)] = (verdict, int(at))
    return checked


def _verdict(row: pd.Series, look: int, n_looks: int, s_max: int) -> str:
    if look == 0:
        return CONTINUE  # nothing is tested before the first look
    if row["verdict"] in SETTLED:
        return row["verdict"]
    if pd.notna(row["seeds_to_decide"]) and row["seeds_to_decide"] > s_max:
        return FUTILE
    return CONTINUE if look < n_looks else INCONCLUSIVE


def _decision(verdicts: pd.Series, look: int, n_looks: int) -> str:
    """continue while any comparison continues; at S_max, inconclusive while any is open; otherwise
    the stop names the weakest outcome: futile if any comparison is futile, equivalent if all are
    equivalent (either kind), else decisive (every comparison better, worse or equivalent, at least one
    of the first two)."""
    if look == 0 or (verdicts == CONTINUE).any():
        return CONTINUE
    if (verdicts == INCONCLUSIVE).any():
        return INCONCLUSIVE
    if (verdicts == FUTILE).any():
        return "stop: futile"
    return "stop: equivalent" if verdicts.isin(EQUIVALENT_VERDICTS).all() else "stop: decisive"


def _open_arms(table: pd.DataFrame, verdicts: pd.Series, keys: list[str]) -> tuple[ArmKey, ...]:
    """The arms of the comparisons still continuing and their baselines, in table order."""
    arms: dict = {}
    for _, row in table[verdicts == CONTINUE].iterrows():
        cell = cell_of(row, keys)
        arms.setdefault(arm_key(row["family"], row["size"], cell))
        arms.setdefault(arm_key(row["baseline"], row["size"], cell))
    return tuple(arms)


def next_seeds(df: pd.DataFrame, *, looks: Sequence[int] = (3, 5, 8), alpha: float = 0.05,
               delta_min: float | Mapping[str, float] = 0.02, baseline: str = "dense", pairing: str = "paired",
               primary_metrics: PrimaryMetrics = ("regbench_tvd",),
               seed: int = 0, by: Sequence[str] | None = None,
               settled: Mapping[ComparisonKey, tuple[str, int]] | None = None) -> SeedPlan:
    """Where the sweep stands in its look schedule, and whether to add seeds, and to which arms.

    n_seeds counts the distinct seeds with a finite primary-metric result. The current look k is the
    last look with looks[k-1] <= n_seeds, and it is analysed on exactly the looks[k-1] smallest seeds:
    seeds run beyond a look wait for the next one, so re-running between looks gives the same verdicts
    and the count of looks stays honest. A run that failed leaves its comparison with fewer pairs at
    that look (n_pairs shows it); so does an arm that got no new seeds because it was settled.

    `comparisons` is `compare` on the confirmatory family (every family != baseline x size x cell keys
    x primary metric; `primary_metrics` as in `compare`) at alpha / K, so ci_* are 1 - alpha/K
    intervals, tost_* are 1 - 2 alpha/K intervals, p_holm is Holm across cells and compare's own
    planning columns are at alpha/K too; then plan_delta, seeds_to_decide, n_more, settled_at_look,
    look and n_looks. verdict: compare's (better / worse, equivalent or equivalent (negligible
    difference), see `analysis.stats.VERDICTS`) at that level, futile (seeds_to_decide > S_max), else
    continue, or inconclusive at S_max; before the first look everything continues.

    `settled` maps `comparison_key`s to (verdict, look) of the comparisons settled at earlier looks
    (a verdict in FINAL: compare's decided verdicts or futile), e.g. `previous_plan.settled` or
    `settled_verdicts(records)`. Their verdicts are kept whatever this look's data say, with
    settled_at_look the look given; they are not re-tested: their p_adj / p_holm are NA, and Holm over
    the open comparisons still counts them, entered at p = 1 (so each look keeps its alpha / K).
    Their other statistics are recomputed on this look's data (the same data when their arm got no
    seeds since). A comparison settled at this look gets settled_at_look = look; continue and
    inconclusive rows have NA. Keys not in the table are ignored.

    seeds_to_decide is the seeds for 80% power at level alpha/K for plan_delta = max(|diff_mean|,
    delta_min), with the observed (or pooled) sigma; S_max + 1 means more than S_max. Planning at the
    observed gap when it exceeds delta_min keeps a large but not yet significant gap (Example A at
    look 1: 0.07 with sigma 0.017) from being called futile merely because a 0.02 gap would need more
    seeds than S_max. n_more: seeds to add to each arm in `open_arms` to reach the next look (0 when
    stopping, and in the rows of settled comparisons).
    """
    looks = _check_looks(looks)
    n_looks, s_max, level_alpha = len(looks), looks[-1], alpha / len(looks)
    metrics = confirmatory_metrics(primary_metrics)
    keys = cell_keys(df) if by is None else list(by)
    primary = df[df["metric"].isin(metrics) & np.isfinite(df["value"])]
    seeds = sorted(primary["seed"].unique())
    look = bisect.bisect_right(looks, len(seeds))
    held = _check_settled(settled, look)
    at_look = primary[primary["seed"].isin(seeds[:looks[look - 1]])] if look else primary
    table = compare(at_look, baseline, pairing, metrics, level_alpha, delta_min, seed, by=keys)
    if table.empty and look:
        raise ValueError(f"no comparison of a primary metric {metrics} against {baseline!r}")
    n_more = looks[look] - len(seeds) if look < n_looks else 0
    row_keys = [_row_key(row, keys) for _, row in table.iterrows()]
    is_held = pd.Series([k in held for k in row_keys], index=table.index, dtype=bool)
    if is_held.any():  # re-test only the open comparisons; Holm still counts the settled ones, at p = 1
        p_holm = pd.Series(holm(table["p_value"].mask(is_held & table["p_value"].notna(), 1.0)), index=table.index)
        table["p_adj"] = table["p_holm"] = p_holm.mask(is_held)
        open_ = ~is_held
        rows = table.loc[open_]
        table.loc[open_, "verdict"] = verdict_rule(rows["p_adj"], rows["ci_low"], rows["ci_high"], rows["tost_low"],
                                                   rows["tost_high"], rows["delta_min"], level_alpha)
        table.loc[open_, "significant"] = table.loc[open_, "verdict"].isin([BETTER, WORSE, NEGLIGIBLE])
        held_verdicts = pd.Series([held[k][0] for k, h in zip(row_keys, is_held) if h], index=table.index[is_held])
        table.loc[is_held, "significant"] = held_verdicts.isin([BETTER, WORSE, NEGLIGIBLE])
        table.loc[is_held, "inside_margin"] = held_verdicts.isin(EQUIVALENT_VERDICTS)
    table["plan_delta"] = np.fmax(table["diff_mean"].abs(), table["delta_min"])
    table["seeds_to_decide"] = pd.array([
        seeds_needed(r.sigma, r.plan_delta, level_alpha, paired=r.pairing == "paired", max_seeds=s_max)
        if np.isfinite(r.sigma) and np.isfinite(r.plan_delta) else pd.NA
        for r in table.itertuples()], dtype="Int64")
    verdicts = pd.Series([held[k][0] if k in held else _verdict(row, look, n_looks, s_max)
                          for k, (_, row) in zip(row_keys, table.iterrows())], index=table.index, dtype=object)
    settled_at = [held[k][1] if k in held else (look if v in FINAL else pd.NA) for k, v in zip(row_keys, verdicts)]
    decision = _decision(verdicts, look, n_looks)
    arms = _open_arms(table, verdicts, keys) if decision == CONTINUE else ()
    all_arms = {arm_key(f, r["size"], cell_of(r, keys))
                for _, r in table.iterrows() for f in (r["family"], r["baseline"])}
    table["n_more"] = np.where(verdicts == CONTINUE, n_more, 0)
    table["settled_at_look"] = pd.array(settled_at, dtype="Int64")
    table["look"], table["n_looks"] = look, n_looks
    table["verdict"] = verdicts
    columns = [c for c in table.columns if c != "verdict"] + ["verdict"]
    n_more = n_more if decision == CONTINUE else 0
    return SeedPlan(decision=decision, n_more=n_more, look=look, n_looks=n_looks,
                    n_seeds=len(seeds), level=1 - level_alpha, comparisons=table[columns], open_arms=arms,
                    cell_keys=tuple(keys), runs_saved=n_more * (len(all_arms) - len(arms)))
