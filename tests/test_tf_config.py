"""A process's place from TF_CONFIG: workers, parameter servers, and bad configurations."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from omnikeras import WorkerConfig
from omnikeras.config import ENV_VAR as OMNIKERAS_CONFIG
from omnikeras.tf_config import TFConfig, worker_config_from_env

CLUSTER = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222", "p1:2223"]}


def _config(task_type: str, index: int, cluster: dict = CLUSTER) -> TFConfig:
    return TFConfig.from_json(json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}))


@pytest.mark.parametrize(("task_type", "index", "worker_index"), [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2)])
def test_the_chief_is_worker_0_and_the_workers_follow_in_order(task_type: str, index: int, worker_index: int) -> None:
    config = _config(task_type, index).worker_config(seed=3)
    assert config == WorkerConfig(("p0:2222", "p1:2223"), worker_index=worker_index, num_workers=3, seed=3)


def test_without_a_chief_worker_0_is_the_chief() -> None:
    cluster = {"worker": ["w0:1", "w1:1"], "ps": ["p:1"]}
    assert _config("worker", 0, cluster).worker_config().is_chief
    assert _config("worker", 1, cluster).worker_config().worker_index == 1


def test_a_ps_task_serves_on_its_own_port_and_is_no_worker() -> None:
    ps = _config("ps", 1)
    assert ps.is_parameter_server and ps.server_port() == 2223
    with pytest.raises(ValueError, match="not a worker"):
        ps.worker_config()
    with pytest.raises(ValueError, match="not a ps"):
        _config("chief", 0).server_port()
    with pytest.raises(ValueError, match="no port"):
        _config("ps", 0, {"worker": ["w:1"], "ps": ["p0"]}).server_port()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"task": {"type": "worker", "index": 0}}', '"cluster" object'),
        (json.dumps({"cluster": {**CLUSTER, "master": ["m:1"]}, "task": {"type": "worker", "index": 0}}), "unknown task types"),
        (json.dumps({"cluster": {**CLUSTER, "chief": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}), "one chief"),
        (json.dumps({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", "index": 0}}), 'no "ps" task'),
        (json.dumps({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}), 'no "chief" or "worker"'),
        (json.dumps({"cluster": CLUSTER}), '"task"'),
        (json.dumps({"cluster": {**CLUSTER, "evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}}), '"task"'),
        (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 2}}), "not in the cluster's 2 worker tasks"),
        (json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": "0"}}), '"task"'),
        (json.dumps({"cluster": {**CLUSTER, "ps": "p:1"}, "task": {"type": "ps", "index": 0}}), "list of"),
    ],
)
def test_bad_configurations_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TFConfig.from_json(text)


def test_omnikeras_config_wins_and_tf_config_takes_the_token_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(OMNIKERAS_CONFIG, raising=False)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert worker_config_from_env() is None
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 1}}))
    monkeypatch.setenv("OMNIKERAS_TOKEN", "s3cret")
    config = worker_config_from_env()
    assert config is not None and (config.worker_index, config.token) == (2, "s3cret")
    monkeypatch.setenv(OMNIKERAS_CONFIG, WorkerConfig(("x:1",)).to_json())
    assert worker_config_from_env() == WorkerConfig(("x:1",))


def test_omnikeras_ps_refuses_a_tf_config_that_names_a_worker() -> None:
    environment = os.environ | {"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 0}})}
    run = subprocess.run([sys.executable, "-m", "omnikeras", "ps"], env=environment, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "names this process worker 0: run the training script" in run.stderr



DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "kubernetes_and_slurm.md"
# The fields of Kubeflow's TFJob (kubeflow.org/v1) a manifest may use at these levels.
TFJOB_SPEC_FIELDS = {"tfReplicaSpecs", "runPolicy", "successPolicy", "enableDynamicWorker"}
TFJOB_REPLICA_TYPES = {"Chief", "Master", "Worker", "PS", "Evaluator"}
REPLICA_SPEC_FIELDS = {"replicas", "restartPolicy", "template"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}


def test_the_documented_tfjob_manifest_uses_tfjobs_field_names() -> None:
    block = re.search(r"```yaml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert block is not None
    manifest = yaml.safe_load(block.group(1))
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert set(manifest) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(manifest["spec"]) <= TFJOB_SPEC_FIELDS
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert set(replicas) <= TFJOB_REPLICA_TYPES and {"PS", "Chief"} <= set(replicas)
    for spec in replicas.values():
        assert set(spec) <= REPLICA_SPEC_FIELDS and spec["restartPolicy"] in RESTART_POLICIES
        (container,) = spec["template"]["spec"]["containers"]
        # The operator writes TF_CONFIG into the container of this name.
        assert container["name"] == "tensorflow"
    ps = replicas["PS"]["template"]["spec"]["containers"][0]
    assert ps["command"][:2] == ["omnikeras", "ps"] and ps["ports"][0]["name"] == "tfjob-port"
    for kind in ("Chief", "Worker"):
        command = replicas[kind]["template"]["spec"]["containers"][0]["command"]
        assert (DOCS.parents[1] / command[1]).is_file(), f"{kind} runs a script the repository has"


def test_the_documented_slurm_script_gives_each_task_its_place(tmp_path) -> None:
    block = re.search(r"```bash\n(#!/bin/bash\n.*?)```", DOCS.read_text(), re.DOTALL)
    assert block is not None
    script = tmp_path / "omnikeras.sbatch"
    script.write_text(block.group(1))
    # Slurm's commands, and the two the tasks run, stood in for: each task prints its role.
    fakes = {
        "scontrol": 'printf "n0\\nn1\\nn2\\nn3\\nn4\\n"',
        "srun": 'for i in 0 1 2 3 4; do SLURM_PROCID=$i "$@"; done',
        "openssl": "echo t0ken",
        "omnikeras": 'echo "$1 $TF_CONFIG"',
        "python": 'echo "script $TF_CONFIG"',
    }
    for name, body in fakes.items():
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    environment = os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n[0-4]"}
    run = subprocess.run(["bash", str(script)], env=environment, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    tasks = [line.split(" ", 1) for line in run.stdout.splitlines()]
    assert [command for command, _ in tasks] == ["ps", "script", "script", "script", "script"]
    configs = [TFConfig.from_json(text) for _, text in tasks]
    assert configs[0].is_parameter_server and configs[0].server_port() == 2222
    assert configs[0].parameter_servers == ("n0:2222",)
    assert [c.worker_config().worker_index for c in configs[1:]] == [0, 1, 2, 3]
