"""Ctrl-C on a driver whose output is piped (`sweep ... | tee log`): the terminal sends SIGINT to
the whole foreground process group, so `tee` dies with the driver's jobs and the driver's next
write meets a broken pipe. The driver still marks its running job interrupted and exits 130, and
the same command resumes, as in a terminal (tests/e2e/test_sweep_e2e.py presses Ctrl-C there)."""
import os
import shlex
import signal
import subprocess

from helpers import CLI, resumes_after_interrupt, running_train, wait_for

LONG = ["size=micro", "family=lidas", "seed=0", "train.steps=400", "train.checkpoint_every=40",
        "cluster.num_cpus=1", "eval.jobs=[regbench]", "tracker=none"]


def test_ctrl_c_with_output_piped_to_tee_interrupts_and_the_same_command_resumes(tmp_path):
    root, log, code = tmp_path / "store", tmp_path / "log", tmp_path / "driver_exit"
    driver = shlex.join([*CLI, "sweep", *LONG, f"store.root={root}", "--name", "e2e"])
    # A process group of its own, as a terminal's foreground job: the shell, the driver, tee and
    # the Ray processes the driver starts. The shell traps SIGINT only to outlive the pipeline
    # and write the driver's exit status (a trap is reset to the default in its children).
    group = subprocess.Popen(["bash", "-c", f"trap true INT; {driver} | tee {log} >/dev/null; "
                                            f"echo ${{PIPESTATUS[0]}} > {code}"], start_new_session=True)
    wait_for(lambda: running_train(root), process=group)
    os.killpg(group.pid, signal.SIGINT)
    assert group.wait(timeout=120) == 0
    assert code.read_text().strip() == "130", log.read_text()
    resumes_after_interrupt(root, *LONG)
