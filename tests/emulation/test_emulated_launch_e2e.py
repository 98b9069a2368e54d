"""`omnikeras launch --emulate` end to end: real namespaces, shaping, cgroups, processes."""

import pathlib
import re
import signal
import subprocess
import sys
import time

import optuna
import pytest
from cluster_results import result_of
from conftest import needs_emulation

from omnikeras.tuner import records
from omnikeras.tuner.records import TrialRecord

SCRIPT = pathlib.Path(__file__).with_name("emulated_script.py")
pytestmark = [pytest.mark.slow, needs_emulation]


def _launch(
    tmp_path: pathlib.Path, *options: str, epochs: int = 10, script_options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--emulate", "mixed",
         *options, str(SCRIPT), "--epochs", str(epochs), *script_options],
        capture_output=True, text=True, timeout=600,
    )


def _leftovers(tmp_path: pathlib.Path) -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    groups = [str(p) for c in ("cpu", "freezer") for p in pathlib.Path(f"/sys/fs/cgroup/{c}").glob("omnikeras-*")]
    processes = subprocess.run(["pgrep", "-f", str(SCRIPT)], capture_output=True, text=True).stdout
    return [line for line in namespaces.splitlines() if line.startswith("omnikeras-")] + groups + processes.split()


def _remove(launcher_pid: int, tmp_path: pathlib.Path) -> None:
    """Kills what a launcher that did not stop left behind, and its namespaces."""
    for pattern in (str(tmp_path), str(SCRIPT)):
        subprocess.run(["pkill", "-9", "-f", pattern], check=False)
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in namespaces:
        if name.startswith(f"omnikeras-{launcher_pid}-"):
            subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> tuple[pathlib.Path, subprocess.CompletedProcess[str]]:
    """A run on the mixed cluster without faults."""
    tmp_path = tmp_path_factory.mktemp("undisturbed")
    return tmp_path, _launch(tmp_path, "--groups", "1", "--group-timeout", "5", epochs=40)


def test_a_run_on_the_mixed_cluster_learns_and_leaves_nothing_behind(undisturbed) -> None:
    tmp_path, run = undisturbed
    assert run.returncode == 0, run.stderr[-3000:]
    chief = result_of(run.stdout)
    assert chief["test_accuracy"] > 0.9
    # One process per host, sized by its cores, reaching the server over the link.
    assert chief["num_workers"] == 5
    assert chief["throughputs"] == [1.0, 0.25, 0.25, 0.25, 0.25]
    assert chief["shared_memory"] == []
    assert "emulating mixed: 5 hosts" in run.stderr
    assert _leftovers(tmp_path) == []


def test_every_fault_is_injected_survived_and_costs_under_a_point_of_accuracy(tmp_path, undisturbed) -> None:
    run = _launch(
        tmp_path, "--groups", "1", "--group-timeout", "5", "--checkpoint-every", "2",
        "--fault", "pause:slow-1@4+3", "--fault", "cut-link:0@9+2", "--fault", "kill-worker:slow-2@13",
        "--fault", "kill-ps:0@16",
        epochs=40,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    injected = (tmp_path / "logs" / "faults.log").read_text().splitlines()
    assert injected == [
        "faults: every worker has joined; the fault clock starts now",
        "fault at 4.0 s: pause host slow-1 for 3 s",
        "fault at 7.0 s: host slow-1 resumed",
        "fault at 9.0 s: cut the link of parameter server 0 for 2 s",
        "fault at 11.0 s: link of parameter server 0 restored",
        "fault at 13.0 s: kill the worker of host slow-2",
        "fault at 16.0 s: kill parameter server 0",
    ]
    for line in injected:
        assert line in run.stderr
    assert re.search(r"worker 3 on host slow-2 was killed by signal 9 .*: restarting it", run.stderr)
    assert re.search(r"parameter server 0 was killed by signal 9 .*: restarting it on its checkpoints", run.stderr)
    accuracy = result_of(run.stdout)["test_accuracy"]
    assert abs(accuracy - result_of(undisturbed[1].stdout)["test_accuracy"]) <= 0.01
    assert _leftovers(tmp_path) == []


def test_the_tuner_s_later_trials_continue_from_one_another_on_the_mixed_cluster(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path}/study.db"
    run = _launch(tmp_path, "--groups", "5", epochs=60, script_options=("--tune", storage))
    assert run.returncode == 0, run.stderr[-3000:]
    assert result_of(run.stdout)["test_accuracy"] > 0.9
    # The slow hosts make one group wait: the compensated search at 5 groups.
    assert "omnivore phase 1: seconds per update" in run.stdout and "searching from 5 groups, compensated" in run.stdout
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    trials = [(records.config_of(t.params), TrialRecord.read(t)) for t in study.trials if t.user_attrs.get("phase", 0) >= 1]
    trials = [(config, record) for config, record in trials if record is not None and not record.interrupted]
    assert len(trials) >= 3 and {config.num_groups for config, _ in trials} == {5}
    # Within a phase: the incumbent, then each candidate followed by the incumbent again
    # (a phase whose budget left no room for a candidate runs the incumbent alone).
    by_phase: dict[int, list] = {}
    for config, record in trials:
        by_phase.setdefault(record.phase, []).append(config)
    for configs in by_phase.values():
        assert [config == configs[0] for config in configs] == [i % 2 == 0 for i in range(len(configs))], configs
    # Each trial starts where the one before ended, or, after one that diverged, where
    # that one started.
    for (_, earlier), (_, later) in zip(trials, trials[1:]):
        if later.phase == earlier.phase:
            assert later.probe_loss_start == (earlier.probe_loss_start if earlier.diverged else earlier.probe_loss_end)
    restored = (tmp_path / "logs" / "ps-0.log").read_text().count("restored snapshot 'omnivore-trial-start'")
    assert restored == sum(record.diverged for _, record in trials)


def test_ctrl_c_removes_the_namespace_cgroups_and_processes(tmp_path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--emulate", "mixed",
         "--fault", "pause:fast@1+60", str(SCRIPT), "--epochs", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "logs" / "faults.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    # Interrupted while a host is frozen: it is thawed, then stopped.
    launcher.send_signal(signal.SIGINT)
    try:
        _, stderr = launcher.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        # Left running, its processes would slow every later test of the suite.
        _remove(launcher.pid, tmp_path)
        raise
    assert launcher.returncode == 130
    assert "interrupted" in stderr
    assert _leftovers(tmp_path) == []


def test_bad_emulation_requests_are_refused_before_anything_starts(tmp_path) -> None:
    wrong_workers = _launch(tmp_path, "--workers", "3")
    assert wrong_workers.returncode == 2
    assert "spec mixed has 5 workers; --workers says 3" in wrong_workers.stderr
    bad_fault = _launch(tmp_path, "--fault", "pause:nowhere@1+1")
    assert bad_fault.returncode == 2
    assert "no host 'nowhere'" in bad_fault.stderr
    assert _leftovers(tmp_path) == []
