"""Finding GPUs without TensorFlow: nvidia-smi and CUDA_VISIBLE_DEVICES."""

import os
import stat

import pytest

from omnikeras.profiles.hardware import local_devices, visible_gpu_count


@pytest.fixture
def two_fake_gpus(tmp_path, monkeypatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\necho 'GPU 1: Fake (UUID: GPU-1)'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_gpus_listed_by_the_driver_are_counted(two_fake_gpus) -> None:
    assert visible_gpu_count() == 2
    assert local_devices() == ["/CPU:0", "/GPU:0", "/GPU:1"]


@pytest.mark.parametrize("visible, count", [("", 0), ("-1", 0), ("1", 1), ("0,1", 2)])
def test_cuda_visible_devices_is_honoured(two_fake_gpus, monkeypatch, visible, count) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpu_count() == count
