"""The command line (bad input, one line per case with its exit code: tests/unit/test_bad_input.py)."""


def test_every_store_command_takes_store_root_as_sweep_does(tmp_path, capsys):
    from orchestrator.cli import main
    from store.store import Store

    store = Store(tmp_path / "s")
    store.create()
    store.record_sweep("one", ["seed=0"], [])
    for argv in (["status", f"store.root={store.root}"], ["status", "one", "--store", str(store.root)],
                 ["cancel", "one", f"store.root={store.root}"]):
        assert main(argv) == 0, argv
        assert "sweep one" in capsys.readouterr().out
    assert main(["report", "one", f"store.root={store.root}"]) == 1  # found; nothing finished yet
    assert "no finished runs yet" in capsys.readouterr().out
    assert main(["status", f"store.root={tmp_path / 'nowhere'}"]) == 2  # a store error: what was asked cannot be done
    assert "no sweeps in" in capsys.readouterr().err


def test_help_lists_the_config_groups_and_points_to_the_docs(capsys):
    """As a Hydra app's --help: each group of conf/ with its options, the registered evaluations,
    and the manual's page of each command, which must exist."""
    from pathlib import Path

    import pytest

    from jobs.evals import EVALUATIONS
    from orchestrator.cli import main
    from orchestrator.config import CONF_DIR

    for argv in (["--help"], ["sweep", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        for group in (d for d in CONF_DIR.iterdir() if d.is_dir()):
            options = ", ".join(sorted(f.stem for f in group.glob("*.yaml")))
            assert any(line.split() == [f"{group.name}:", *options.split()] for line in out.splitlines()), group
        assert f"eval.jobs: {', '.join(EVALUATIONS.names())}" in " ".join(out.split())
    docs = Path(__file__).resolve().parents[2] / "docs"
    for command in ("sweep", "status", "report", "cancel", "wandb-sync", "wandb-dashboard", "run-one"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        pages = [word.strip(".,") for word in capsys.readouterr().out.split() if word.strip(".,").endswith(".md")]
        assert pages and all((docs / page).is_file() for page in pages), (command, pages)


def test_flags_may_come_between_overrides_and_sweep_takes_store(tmp_path, capsys):
    """Hydra's habit: `sweep family=dense --dry-run seed=0,1`; `--store DIR` is store.root."""
    from orchestrator.cli import main

    root = tmp_path / "store"
    assert main(["sweep", "size=micro", "--dry-run", "family=dense", "--name", "mixed", "seed=0,1",
                 "--store", str(root)]) == 0
    out = capsys.readouterr().out
    assert "sweep mixed: 2 runs, 2 to do; dry run, nothing written" in out
    assert not root.exists()


def test_long_sweep_names_end_in_a_hash_of_the_whole_grid():
    from orchestrator.grid import MAX_NAME, default_sweep_name

    def grid(last: str) -> dict[str, list[str]]:
        return {f"train.key_{i:02d}": [f"train.key_{i:02d}=1"] for i in range(12)} | {"zz": [f"zz={last}"]}

    first, second = default_sweep_name(grid("a")), default_sweep_name(grid("b"))
    assert max(len(first), len(second)) <= MAX_NAME and first != second
    (cut, digest), (cut_too, _) = first.rsplit("-", 1), second.rsplit("-", 1)
    assert cut == cut_too and len(digest) == 8
    assert default_sweep_name({"family": ["family=dense", "family=lidas"]}) == "family-dense-lidas"  # short: as before


def test_dry_run_states_the_smallest_difference_the_seeds_can_detect(tmp_path, capsys):
    """Per confirmatory metric, the difference each comparison with dense detects at 80% power at
    Holm's first-step level (statistics.md, "Before a sweep"): from a declared adaptive.seed_sd, from
    a pilot (this sweep's finished runs in the store, which win), "unknown" without either; an
    adaptive sweep plans S_max seeds at alpha / K per look. adaptive.seed_sd does not name the sweep."""
    from test_analysis_load import write_run, write_sweep

    from analysis.stats import effect_for_power, mde
    from orchestrator.cli import main
    from store.store import Store

    def detectable(*overrides: str) -> list[str]:
        assert main(["sweep", "--dry-run", "size=micro", "family=lidas,dense", *overrides]) == 0
        out = capsys.readouterr().out
        assert "sweep family-dense-lidas_size-micro" in out or "sweep adaptive" in out
        return [line for line in out.splitlines() if line.startswith("detectable")]

    root = tmp_path / "store"
    lines = detectable("seed=0,1,2", f"store.root={root}", "adaptive.seed_sd.induction_max=0.05")
    assert [line.split(" on ")[1].split()[0] for line in lines] == ["regbench_tvd", "ablation_drop_f1",
                                                                   "induction_max"]
    assert lines[0] == ("detectable at 80% power with 3 seeds: |difference| on regbench_tvd unknown (no pilot,"
                        f" adaptive.seed_sd.regbench_tvd unset); it is {effect_for_power(3, 0.05 / 3):.3g} x the seed"
                        " sd of the difference"
                        " (1 comparison with dense, Holm level 0.0167 = 0.05/3)")
    assert f"|difference| >= {mde(0.05, 3, 0.05 / 3):.3g} on induction_max" in lines[2]
    assert "seed sd 0.05 declared in adaptive.seed_sd" in lines[2] and not root.exists()

    Store(root).create()  # a pilot: the same sweep's finished runs, 3 seeds of each family
    tvd = {"dense": [0.30, 0.28, 0.33], "lidas": [0.25, 0.27, 0.26]}  # differences sd 0.030551
    ids = []
    for family, values in tvd.items():
        for seed, value in enumerate(values):
            ids.append(f"{family}-{seed}")
            write_run(root, ids[-1], family, "micro", seed, {"regbench_tvd": value, "induction_max": 0.5 + seed / 10})
    write_sweep(root, "family-dense-lidas_size-micro", ids, "2025-01-01T00:00:00", ["family=lidas,dense", "size=micro"])
    lines = detectable("seed=range(0,10)", f"store.root={root}", "adaptive.seed_sd.regbench_tvd=0.5")
    assert lines[0] == (f"detectable at 80% power with 10 seeds: |difference| >= {mde(0.030551, 10, 0.05 / 3):.3g}"
                        f" on regbench_tvd (1 comparison with dense; {effect_for_power(10, 0.05 / 3):.3g} x seed sd"
                        " 0.0306 from the pilot (sweep family-dense-lidas_size-micro: 1 comparison with dense, 2 df),"
                        " Holm level 0.0167 = 0.05/3)")
    assert "unknown (no pilot sd: sweep family-dense-lidas_size-micro has no 2 paired seeds of ablation_drop_f1" \
           " with dense, adaptive.seed_sd.ablation_drop_f1 unset)" in lines[1]

    (line,) = detectable("adaptive.metric=regbench_tvd", "adaptive.seed_sd.regbench_tvd=0.02",
                         f"store.root={tmp_path / 'other'}")
    assert line.startswith(f"detectable at 80% power with 8 seeds (adaptive.max_seeds, the last look): |difference| >="
                           f" {mde(0.02, 8, 0.05 / 3):.3g} on regbench_tvd (1 comparison with dense;")
    assert line.endswith("Holm level 0.0167 = 0.05/3 looks/1)")
