import json

import pytest

from omnikeras import WorkerConfig
from omnikeras.config import ENV_VAR


def test_round_trips_through_json() -> None:
    config = WorkerConfig(("a:1", "b:2"), worker_index=2, num_workers=3, throughputs=(1.0, 2.0, 3.0), token="t")
    assert WorkerConfig.from_json(config.to_json()) == config
    assert config.worker_id == 3 and not config.is_chief
    assert config.throughput_of(2) == 2.0


def test_reads_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert WorkerConfig.from_env() is None
    monkeypatch.setenv(ENV_VAR, json.dumps({"parameter_servers": ["h:5"], "num_workers": 2}))
    assert WorkerConfig.from_env() == WorkerConfig(("h:5",), num_workers=2)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[1]", "JSON object"),
        ('{"num_workers": 2}', "parameter_servers"),
        ('{"parameter_servers": ["h:1"], "workers": 2}', "unknown keys"),
        ('{"parameter_servers": []}', "at least one"),
        ('{"parameter_servers": ["h:1"], "worker_index": 2, "num_workers": 2}', "not in"),
        ('{"parameter_servers": ["h:1"], "num_workers": 2, "throughputs": [1]}', "1 entries for 2"),
        ('{"parameter_servers": ["h:1"], "throughputs": [0]}', "positive"),
    ],
)
def test_bad_configurations_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkerConfig.from_json(text)
