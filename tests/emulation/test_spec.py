"""Cluster specs: built-ins, files, and the errors that name what is wrong."""

import json

import pytest

from omnikeras.emulation import ClusterSpec, FaultSpec, HostSpec, SpecError, parse_bandwidth


def test_the_built_in_specs() -> None:
    cluster = ClusterSpec.load("cpu-cluster-1gbit")
    assert [host.name for host in cluster.hosts] == [f"cpu-{i}" for i in range(8)]
    assert {host.cpus for host in cluster.hosts} == {0.25}
    assert cluster.link_bits_per_second == 1e9
    mixed = ClusterSpec.load("mixed")
    assert [(host.name, host.cpus) for host in mixed.hosts] == [("fast", 1.0)] + [(f"slow-{i}", 0.25) for i in range(4)]
    assert mixed.workers == 5


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_spec_file(tmp_path, suffix: str) -> None:
    fields = {
        "link": "100mbit",
        "hosts": [{"name": "a", "cpus": 0.5, "workers": 2}, {"name": "b", "cpuset": "0-1"}],
        "faults": [{"kind": "pause", "target": "a", "at": 3, "seconds": 2}, {"kind": "kill_ps", "target": 0, "at": 9}],
    }
    path = tmp_path / f"small{suffix}"
    path.write_text(json.dumps(fields))  # JSON is YAML too
    spec = ClusterSpec.load(str(path))
    assert spec.name == "small"
    assert spec.hosts == (HostSpec("a", cpus=0.5, workers=2), HostSpec("b", cpuset="0-1"))
    assert spec.workers == 3
    assert spec.hosts[1].cores == 2.0
    assert spec.link_bits_per_second == 1e8
    assert spec.faults == (FaultSpec("pause", 3.0, "a", 2.0), FaultSpec("kill_ps", 9.0, "0"))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hosts": [{"name": "a"}]}, "'link' and 'hosts' are required"),
        ({"link": "1gbit", "hosts": [], "extra": 1}, "unknown keys ['extra']"),
        ({"link": "fast", "hosts": [{"name": "a"}]}, "bandwidth 'fast'"),
        ({"link": "1gbit", "hosts": []}, "no hosts"),
        ({"link": "1gbit", "hosts": [{"name": "a"}, {"name": "a"}]}, "['a'] appear more than once"),
        ({"link": "1gbit", "hosts": [{"name": "a b"}]}, "host name 'a b'"),
        ({"link": "1gbit", "hosts": [{"name": "a", "cpus": 0}]}, "cpus must be a positive number"),
        ({"link": "1gbit", "hosts": [{"name": "a", "cpus": "half"}]}, "cpus must be a number"),
        ({"link": "1gbit", "hosts": [{"name": "a", "cpuset": "x"}]}, "cpuset must look like"),
        ({"link": "1gbit", "hosts": [{"name": "a", "cores": 1}]}, "host keys ['cores'] unknown"),
        ({"link": "1gbit", "hosts": [{"name": "a"}], "faults": [{"kind": "pause", "target": "b", "at": 1, "seconds": 1}]}, "no host 'b'"),
        ({"link": "1gbit", "hosts": [{"name": "a"}], "faults": [{"kind": "melt", "target": "a", "at": 1}]}, "fault kind 'melt'"),
        ({"link": "1gbit", "hosts": [{"name": "a"}], "faults": [{"kind": "cut_link", "target": "0", "at": 1}]}, "seconds must be positive"),
    ],
)
def test_bad_specs_are_refused_with_what_is_wrong(fields: dict, message: str) -> None:
    with pytest.raises(SpecError) as raised:
        ClusterSpec.from_dict("broken", fields)
    assert message in str(raised.value)


def test_neither_a_built_in_nor_a_file(tmp_path) -> None:
    with pytest.raises(SpecError, match="neither a built-in spec"):
        ClusterSpec.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        ClusterSpec.load(str(bad))


def test_faults_in_the_command_line_form() -> None:
    assert FaultSpec.parse("pause:slow-1@20+5") == FaultSpec("pause", 20.0, "slow-1", 5.0)
    assert FaultSpec.parse("kill-worker:fast@3") == FaultSpec("kill_worker", 3.0, "fast")
    assert FaultSpec.parse("cut-link:0@1.5+2") == FaultSpec("cut_link", 1.5, "0", 2.0)
    for text in ("pause:slow-1", "pause@3+1", "kill-ps:zero@3"):
        with pytest.raises(SpecError):
            FaultSpec.parse(text)
    spec = ClusterSpec.load("mixed").with_faults([FaultSpec.parse("pause:fast@1+1")])
    assert spec.faults[-1].target == "fast"


def test_bandwidths_in_tc_units() -> None:
    assert parse_bandwidth("1gbit") == 1e9
    assert parse_bandwidth("2.5mbit") == 2.5e6
    assert parse_bandwidth("800kbit") == 8e5
    with pytest.raises(SpecError, match="one of bit, kbit, mbit, gbit"):
        parse_bandwidth("10MB")
