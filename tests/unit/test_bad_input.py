"""Bad input through the real CLI (in-process `main`): each case is one line naming the problem
and the fix, exit 2 (usage) or 1 (runtime), and the store byte-identical before and after."""
import shutil
from pathlib import Path

import pytest

from common.atomic import write_json
from orchestrator import config
from orchestrator.cli import main
from store.layout import FORMAT_VERSION
from store.store import Store
from test_config import EVALUATION_NAMES, FAMILY_NAMES, SIZE_NAMES

MICRO = ["size=micro", "family=dense", "seed=0"]

# (argv, exit code, text the single error line must contain); {store} is the populated store.
CASES = [
    # group choices, keys and types
    (["sweep", "family=foo"], 2, f"family=foo: no such family; choose one of: {FAMILY_NAMES}"),
    (["sweep", "size=huge"], 2, f"size=huge: no such size; choose one of: {SIZE_NAMES}"),
    (["sweep", "family=[]"], 2, "family=[]: a list of family options; choose one"),
    (["sweep", "model=foo"], 2, "model: is a config section, not a str; set one of its keys"),
    (["sweep", "train.stepz=3"], 2, "train.stepz: unknown key; check the spelling"),
    (["sweep", "+train.stepz=3"], 2, "train.stepz: unknown key; check the spelling"),
    (["sweep", "train.steps=abc"], 2, "train.steps=abc: expected integer, got 'abc'"),
    (["sweep", "train.lr=fast"], 2, "train.lr=fast: expected float, got 'fast'"),
    (["sweep", "eval.jobs=[nope]"], 2,
     f"eval.jobs=nope: no such evaluation (did you mean noop?); choose one of: {EVALUATION_NAMES}"),
    # values the declared constraints refuse (common/settings.py): bounds, finiteness, choices
    (["sweep", "data.seed=-3"], 2, "data.seed=-3: must be a non-negative integer"),
    (["sweep", "train.lr=1e400"], 2, "train.lr=inf: must be a finite number"),
    (["sweep", "train.lr=nan"], 2, "train.lr=nan: must be a finite number"),
    (["sweep", "cluster.num_cpus=0"], 2, "cluster.num_cpus=0: must be > 0"),
    (["sweep", "train.warmup_steps=-1"], 2, "train.warmup_steps=-1: must be >= 0"),
    (["sweep", "family=lidas", "family.growth.alpha=inf"], 2, "family.growth.alpha=inf: must be a finite number"),
    (["sweep", "model.n_heads=0"], 2, "model.n_heads=0: must be > 0"),
    (["sweep", "train.beta1=1"], 2, "train.beta1=1: must be < 1"),
    (["sweep", "eval.ablation.fractions=[]"], 2, "eval.ablation.fractions=[]: must not be empty"),
    (["sweep", "adaptive.delta_min=0"], 2, "adaptive.delta_min=0: must be > 0"),
    (["sweep", "adaptive.seed_sd.regbench_tvd=nan"], 2,
     "adaptive.seed_sd.regbench_tvd=nan: must be a finite number > 0"),
    (["sweep", "adaptive.seed_sd={{regbench_tvd:0}}"], 2,  # braces doubled: the argv is formatted
     "adaptive.seed_sd.regbench_tvd=0.0: must be a finite number > 0"),
    (["sweep", "adaptive.seed_sd.regbench_tvdd=0.02"], 2,
     "adaptive.seed_sd.regbench_tvdd: not a metric of this sweep; choose among: "),
    (["sweep", "adaptive.seed_sd=0.02"], 2, "adaptive.seed_sd: Cannot assign float to Dict[str, float]"),
    (["sweep", "tracker.init_timeout_s=-1"], 2, "tracker.init_timeout_s=-1: must be > 0"),
    (["sweep", "cluster.address=auto"], 2, "cluster.address: unknown key"),
    # seeds and sweep lists
    (["sweep", "seed=-1"], 2, "seed=-1: must be a non-negative integer"),
    (["sweep", "seed=1.5"], 2, "seed=1.5: expected integer, got '1.5'"),
    (["sweep", "--dry-run", "family=dense", "seed=x,1"], 2, "seed=x: expected integer"),
    (["sweep", "seed=range(3,3)"], 2, "seed: the sweep is empty; give at least one value"),
    # malformed overrides, shell metacharacters (never run: overrides are data, not commands)
    (["sweep", "seed=[1,"], 2, "malformed override 'seed=[1,'"),
    (["sweep", "=3"], 2, "malformed override '=3': no key before '='; write key=value"),
    (["sweep", "seed=$(touch pwned)"], 2, "malformed override 'seed=$(touch pwned)'"),
    (["sweep", "family=dense;touch pwned"], 2, "malformed override 'family=dense;touch pwned'"),
    (["sweep", "family=dense&&touch pwned"], 2, "malformed override 'family=dense&&touch pwned'"),
    (["sweep", "family=`touch pwned`"], 2, "malformed override 'family=`touch pwned`'"),
    (["sweep", "train.steps=1|touch pwned"], 2, "train.steps=1|touch pwned: expected integer"),
    (["sweep", "--name", "../../escape", *MICRO], 2, "--name '../../escape': it names a directory under sweeps/"),
    # growth, loops, shapes
    (["sweep", "family=lidas", "size=micro", "family.growth.initial_blocks=4"], 2,
     "family.growth.initial_blocks=4: the schedule does not grow (final depth 4 = 4 blocks of 1); use fewer"),
    (["sweep", "family=lidas", "size=micro", "family.growth.initial_blocks=9"], 2,
     "family.growth.initial_blocks=9: the schedule does not grow"),
    (["sweep", "family=lidas", "size=micro", "family.growth.block_layers=3"], 2,
     "family.growth.block_layers=3: must divide model.n_layers=4"),
    (["sweep", "family=looped", "family.loop.block_layers=7"], 2,
     "family.loop.block_layers=7: block plus prelude and coda (13 layers) exceed model.n_layers=6"),
    (["sweep", "family=looped", "family.loop.loops=0"], 2,
     "family.loop.loops=0: a looped model needs loops >= 2 (set family.loop.loops"),
    (["sweep", "family=lidas", "family.growth.initial_blocks=1", "train.steps=2", "train.warmup_steps=0"], 2,
     "train.steps=2: fewer than the 3 growth stages; raise train.steps"),
    (["sweep", "size=micro", "model.n_heads=5"], 2, "model.n_heads=5: must divide model.d_model=32"),
    (["sweep", "model.n_kv_heads=3"], 2, "model.n_kv_heads=3: must divide model.n_heads=2"),
    (["sweep", "train.max_retries=-1"], 2, "train.max_retries=-1: must be >= 0"),
    # data: instances never cut silently (docs/experiment.md), the fixed training set
    (["sweep", "data=regbench", "size=micro"], 2,
     "data.seq_len=64: shorter than the longest instance of data=regbench (19 strings of up to 49 symbols, "
     "each after a |: 950 tokens, so data.seq_len >= 949); use a size with model.max_seq_len >= 949"),
    (["sweep", "size=micro", "data.cut_at_context=false"], 2, "data.seq_len=64: shorter than the longest instance"),
    (["sweep", "size=micro", "data.train_sequences=0"], 2, "data.train_sequences=0: must be > 0"),
    (["sweep", "size=360m", "backend=nanotron", "data.train_sequences=5000"], 2,
     "data.train_sequences=5000: backend=nanotron trains on its own dataset, not on data.*"),
    # usage
    (["sweeep"], 2, "invalid choice: 'sweeep'"),
    (["status", "--store"], 2, "argument --store: expected one argument; see `python -m orchestrator status --help`"),
    # the store: refused with exit 2, and left byte-identical (store/store.py `format_of`)
    (["report", "nope", "--store", "{store}"], 2, "no sweep named 'nope' in"),
    (["status", "--store", "{empty}"], 2, "no sweeps in"),
    (["report", "--store", "{empty}"], 2, "no sweeps in"),
    (["status", "--store", "{future}"], 2, f"format version 99, newer than this code's {FORMAT_VERSION}; upgrade"),
    (["report", "x", "--store", "{future}"], 2, "format version 99, newer"),
    (["sweep", *MICRO, "store.root={future}"], 2, "format version 99, newer"),
    (["status", "--store", "{torn}"], 2, "sweep.yaml: unreadable"),
    *[(argv, 2, needle) for root, needle in (
        ("foreign", 'store.json holds {"name": "someone else\'s"}, not this orchestrator\'s marker; '
                    'choose another store.root'),
        ("listed", "store.json holds [3], not this orchestrator's marker; choose another store.root"),
        ("garbled", "store.json is not JSON, so not this orchestrator's store"),
        ("file", "is a file, not a results store; choose another store.root"),
        ("unrelated", "holds files that are not a results store (notes.txt, photos) and no store.json; choose"))
      for argv in (["status", "--store", f"{{{root}}}"], ["report", "--store", f"{{{root}}}"],
                   ["sweep", *MICRO, f"store.root={{{root}}}"],
                   ["sweep", *MICRO, f"store.root={{{root}}}", "--dry-run"])],
]


# The sweep-wide rules (orchestrator/preflight.py) and the habits of other tools: refused alike by
# `--dry-run` and by the real run, with the same line, before anything is written.
PREFLIGHT = [
    ([*MICRO, "eval.jobs=[]"], 2,
     "eval.jobs=[]: the runs would evaluate nothing, so the sweep's report would be empty"),
    ([*MICRO, "hydra.job.chdir=true"], 2, "hydra.job.chdir=true: Hydra's runtime settings (hydra.*) do not apply"),
    ([*MICRO, "hydra.run.dir=/tmp/elsewhere"], 2, "hydra.run.dir=/tmp/elsewhere: Hydra's runtime settings"),
    ([*MICRO, "hydra/launcher=basic"], 2, "hydra/launcher=basic: Hydra's runtime settings"),
    (["size=micro", "family=dense", "seed=0..2"], 2, "seed=0..2: Hydra has no a..b ranges; write seed='range(0,3)'"),
    (["size=micro", "family=dense,lidas", "adaptive.metric=regbench_tvd", "adaptive.max_seeds=2",
      "adaptive.looks=[2]"], 2, "adaptive.max_seeds=2: a single look at 2 seeds adds no seeds"),
    (["size=micro", "family=lidas,looped", "adaptive.metric=regbench_tvd"], 2,
     "adaptive.baseline=dense: the sweep's families are ['lidas', 'looped']; include the baseline"),
    ([*MICRO, "resources.gpus=1"], 2, "job train needs 1 node(s) with CPU=1 GPU=1 memory=1G each, but only 0 of the "
                                      "cluster's 1 nodes can hold that"),
    ([*MICRO, "resources.nodes=2"], 2, "job train needs 2 node(s)"),
    ([*MICRO, "resources.memory_gb=100000"], 2, "memory=1e+05G each, but only 0 of the cluster's 1 nodes"),
    ([*MICRO, "eval.resources.gpus=1"], 2, "job regbench needs 1 node(s) with CPU=1 GPU=1"),
    (["size=micro", "family=lidas", "--name", "demo"], 2,
     "--name demo: the recorded sweep demo has another grid (family=lidas here, dense recorded; size=micro here, "
     "(default) recorded)"),
    ([*MICRO, "--name", "x" * 121], 2, "it names a directory under sweeps/; use up to 120 letters"),
    ([*MICRO, "cluster=ray", "cluster.address=127.0.0.1:1"], 1,
     "cluster.address=127.0.0.1:1: nothing listening there (Connection refused); check that `ray start --head`"),
    ([*MICRO, "cluster=ray", "cluster.address=nowhere"], 2, "cluster.address=nowhere: not host:port; give the"),
    ([*MICRO, "cluster=ray", "cluster.address=10.0.0.5"], 2, "cluster.address=10.0.0.5: not host:port"),
    ([*MICRO, "cluster=ray", "cluster.address=:6379"], 2, "cluster.address=:6379: not host:port"),
    ([*MICRO, "cluster=ray", "cluster.address=10.0.0.5:70000"], 2, "cluster.address=10.0.0.5:70000: not host:port"),
]


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
            for p in [root, *sorted(root.rglob("*"))]}


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """A store with a sweep and a finished-looking run, an empty directory, a store from a
    future format version, one whose sweep.yaml was cut short, and roots that are not a store of
    ours: someone else's store.json, one holding a JSON list or no JSON, a regular file, and a
    directory of unrelated files."""
    base = tmp_path_factory.mktemp("stores")
    store = Store(base / "store")
    store.create()
    store.record_sweep("demo", ["family=dense"], ["abc123abc123"])
    store.start_job("abc123abc123", "train", ["train"])
    store.end_job("abc123abc123", "train", ["train"])
    (base / "empty").mkdir()
    write_json(base / "future" / "store.json", {"format_version": 99})
    torn = Store(base / "torn")
    torn.create()
    torn.record_sweep("t", [], ["a"])
    path = torn.sweep_dir("t") / "sweep.yaml"
    path.write_text(path.read_text()[:12] + "\n  - [")
    for name, text in (("foreign", '{"name": "someone else\'s"}'), ("listed", "[3]"), ("garbled", "{format")):
        (base / name).mkdir()
        (base / name / "store.json").write_text(text)
    (base / "file").write_text("not a directory")
    (base / "unrelated" / "photos").mkdir(parents=True)
    (base / "unrelated" / "notes.txt").write_text("mine")
    return {name: base / name for name in ("store", "empty", "future", "torn", "foreign", "listed", "garbled",
                                           "file", "unrelated")}


def run_case(argv: list[str], stores: dict[str, Path], capsys) -> tuple[int, list[str]]:
    argv = [a.format(**stores) for a in argv]
    if argv[0] == "sweep" and not any(a.startswith("store.root=") for a in argv):
        argv.append(f"store.root={stores['store']}")
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out = capsys.readouterr()
    return code, [line for line in (out.out + out.err).splitlines() if line.strip()]


@pytest.mark.parametrize("argv, code, needle", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_with_the_fix_and_changes_nothing(argv, code, needle, stores, capsys,
                                                                 tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a shell would have created `pwned`
    before = {name: snapshot(root) for name, root in stores.items()}
    got, lines = run_case(argv, stores, capsys)
    assert (got, len(lines)) == (code, 1), lines
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert {name: snapshot(root) for name, root in stores.items()} == before
    assert not list(tmp_path.iterdir())


def test_yaml_syntax_error_in_conf_names_the_file_and_line(stores, capsys, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(config.CONF_DIR, conf)
    (conf / "family" / "dense.yaml").write_text("name: dense\n  growth: [\n")
    monkeypatch.setattr(config, "CONF_DIR", conf)
    before = snapshot(stores["store"])
    code, lines = run_case(["sweep", "family=dense", "seed=0"], stores, capsys)
    assert (code, len(lines)) == (2, 1), lines
    assert lines[0].startswith(f"error: {conf / 'family' / 'dense.yaml'}:2: YAML syntax error (")
    assert lines[0].endswith("; fix that file")
    assert snapshot(stores["store"]) == before


@pytest.mark.parametrize("overrides, code, needle", PREFLIGHT, ids=[" ".join(c[0])[:80] for c in PREFLIGHT])
def test_the_dry_run_refuses_what_the_real_run_refuses_before_writing(overrides, code, needle, stores, capsys):
    before = snapshot(stores["store"])
    refusals = []
    for mode in (["--dry-run"], []):
        got, lines = run_case(["sweep", *mode, *overrides], stores, capsys)
        assert (got, len(lines)) == (code, 1), (mode, lines)
        assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
        refusals.append(lines[0])
        assert snapshot(stores["store"]) == before
    assert refusals[0] == refusals[1]


def test_a_new_store_stays_absent_when_the_sweep_is_refused(tmp_path, capsys):
    root = tmp_path / "new"
    for mode in (["--dry-run"], []):
        assert main(["sweep", *mode, *MICRO, "eval.jobs=[]", f"store.root={root}"]) == 2
        assert not root.exists()
    assert len(capsys.readouterr().err.splitlines()) == 2


def test_multirun_flag_is_a_one_line_hint(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "-m", *MICRO])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: -m/--multirun: every sweep is a multirun already")


def test_estimates_far_beyond_the_resources_are_warned_with_the_estimate(tmp_path, capsys):
    """A 3B model on two CPU cores: the dry run says how long and how much memory, and runs."""
    cpu_3b = ["size=3b", "family=dense", "seed=0", "resources.gpus=0", "resources.nodes=1", "resources.cpus=2",
              "resources.memory_gb=4", f"store.root={tmp_path / 's'}"]
    assert main(["sweep", "--dry-run", *cpu_3b]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "1 run trains on CPUs for more than 24 hours each, e.g. dense-3b-s0: 8.07e+21 FLOPs, about" in warnings[0]
    assert "about 45.8 GB (weights, gradients and Adam's moments) against resources.memory_gb=4" in warnings[1]
    assert not (tmp_path / "s").exists()


def test_the_same_name_extends_with_other_seeds_and_clusters(stores, capsys):
    """`--name demo` of the recorded grid (family=dense) with other seeds, another cluster
    setting, tracker or list of evaluations (none changes a run's id) passes the name check."""
    got, lines = run_case(["sweep", "--dry-run", "family=dense", "seed=5,6", "cluster.num_cpus=1", "tracker=none",
                           "eval.jobs=[regbench]", "--name", "demo"], stores, capsys)
    assert got == 0, lines
