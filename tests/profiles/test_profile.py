"""`ClusterProfile` and `DeviceProfile`: JSON, interpolation, and batch shares."""

import pytest

from omnikeras.profiles import ClusterProfile, DeviceProfile, batch_shares


def _profile() -> ClusterProfile:
    return ClusterProfile(
        model="omnikeras.profiles.reference_cnn:reference_cnn",
        parameter_count=1_199_882,
        devices=(
            DeviceProfile("/CPU:0", "CPU", (16, 64, 256), (400.0, 900.0, 1000.0), 2, 1),
            DeviceProfile("/GPU:0", "GPU", (16, 64, 256), (1500.0, 5000.0, 9000.0)),
        ),
        push_pull_seconds=0.004,
        host="box",
    )


def test_json_round_trips(tmp_path) -> None:
    profile = _profile()
    assert ClusterProfile.from_json(profile.to_json()) == profile
    profile.save(tmp_path / "p.json")
    assert ClusterProfile.load(tmp_path / "p.json") == profile


def test_throughput_interpolates_and_flattens_outside_the_measured_sizes() -> None:
    cpu = _profile().device("/CPU:0")
    assert cpu.throughput(40) == pytest.approx(650.0)
    assert cpu.throughput(1024) == 1000.0
    assert cpu.throughput(1) == 400.0
    assert cpu.step_seconds(64) == pytest.approx(64 / 900)
    assert cpu.peak_throughput == 1000.0


def test_the_cpu_and_devices_are_found_by_name() -> None:
    profile = _profile()
    assert profile.cpu is not None and profile.cpu.name == "/CPU:0"
    assert profile.device("/GPU:0").kind == "GPU"
    with pytest.raises(KeyError, match="/GPU:1"):
        profile.device("/GPU:1")


@pytest.mark.parametrize("throughputs, batch, shares", [
    ([1.0, 3.0], 64, [16, 48]),
    ([1.0, 1.0, 1.0], 64, [21, 22, 21]),
    ([900.0, 2700.0, 900.0, 2700.0], 96, [12, 36, 12, 36]),
    ([5.0], 7, [7]),
])
def test_batch_shares_follow_throughput_ratios_and_add_up(throughputs, batch, shares) -> None:
    assert batch_shares(throughputs, batch) == shares
    assert sum(batch_shares(throughputs, batch)) == batch


@pytest.mark.parametrize("sizes, rates, message", [
    ((64, 16), (1.0, 2.0), "increasing"),
    ((16,), (1.0, 2.0), "one throughput per batch size"),
    ((16,), (float("nan"),), "positive"),
])
def test_bad_device_profiles_are_refused(sizes, rates, message) -> None:
    with pytest.raises(ValueError, match=message):
        DeviceProfile("/CPU:0", "CPU", sizes, rates)
