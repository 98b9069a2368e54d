"""Thread settings: the candidates, sharing the cores, the environment, the cache."""

import json
import socket

import pytest

from omnikeras.profiles import thread_cache
from omnikeras.profiles.hardware import cpu_count
from omnikeras.profiles.threads import ThreadSettings, candidate_settings


def test_candidates_cover_powers_of_two_and_the_core_count() -> None:
    intra = sorted({c.intra_op for c in candidate_settings(6)})
    assert intra == [1, 2, 4, 6]
    assert {c.inter_op for c in candidate_settings(6)} == {1, 2}
    assert candidate_settings(1) == [ThreadSettings(1, 1), ThreadSettings(1, 2)]


def test_processes_share_the_intra_op_threads() -> None:
    assert ThreadSettings(8, 2).shared_by(2) == ThreadSettings(4, 2)
    assert ThreadSettings(2, 1).shared_by(4) == ThreadSettings(1, 1)
    assert ThreadSettings(3, 1).environment() == {"TF_NUM_INTRAOP_THREADS": "3", "TF_NUM_INTEROP_THREADS": "1"}
    with pytest.raises(ValueError):
        ThreadSettings(0, 1)


def test_the_cache_answers_without_measuring(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OMNIKERAS_CACHE_DIR", str(tmp_path))
    key = f"{socket.gethostname()}, {cpu_count()} cores, tensorflow {thread_cache._tensorflow_version()}"
    (tmp_path / thread_cache.CACHE_FILE).write_text(json.dumps({key: {"intra_op": 3, "inter_op": 2}}))

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured although the cache had the answer")

    monkeypatch.setattr(thread_cache, "search_thread_settings", must_not_measure)
    said: list[str] = []
    assert thread_cache.cached_thread_settings(said.append) == ThreadSettings(3, 2)
    assert said == []


def test_a_missing_or_broken_cache_is_measured_and_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OMNIKERAS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / thread_cache.CACHE_FILE).write_text("{not json")
    calls = []

    def fake_search(model, batch_size, **kwargs):
        calls.append((model, batch_size))
        return ThreadSettings(1, 2), {}

    monkeypatch.setattr(thread_cache, "search_thread_settings", fake_search)
    said: list[str] = []
    assert thread_cache.cached_thread_settings(said.append) == ThreadSettings(1, 2)
    assert len(calls) == 1 and "measuring the CPU thread settings once" in said[0]
    # Measured once: the second call reads the file.
    assert thread_cache.cached_thread_settings(said.append) == ThreadSettings(1, 2)
    assert len(calls) == 1
