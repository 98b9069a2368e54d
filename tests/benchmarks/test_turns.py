"""Runs started by `turns.run_in_turns` take their turns one at a time, in alternating order."""

import pathlib
import sys
import textwrap

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from turns import run_in_turns  # noqa: E402

# Notes when each of its turns begins and ends, after a warm-up of its own.
_RUN = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {benchmarks!r})
    from turns import Turn

    turn = Turn.from_environment()
    spans = []
    time.sleep(0.05)
    turn.end()
    for _ in range({turns}):
        began = time.monotonic()
        time.sleep(0.05)
        spans.append((began, time.monotonic()))
        turn.end()
    print("RESULT " + json.dumps({{"name": sys.argv[1], "spans": spans}}))
    """
)


def test_runs_take_turns_one_at_a_time(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(_RUN.format(benchmarks=str(BENCHMARKS), turns=3))
    commands = {name: [sys.executable, str(script), name] for name in ("a", "b")}
    results = run_in_turns(commands, 3, {}, str(tmp_path))
    assert {name: result["name"] for name, result in results.items()} == {"a": "a", "b": "b"}
    spans = sorted((began, ended, name) for name, result in results.items() for began, ended in result["spans"])
    assert [name for _, _, name in spans] == ["a", "b", "b", "a", "a", "b"]
    for (_, ended, _), (began, _, _) in zip(spans, spans[1:]):
        assert ended <= began


def test_a_run_that_fails_is_reported_with_its_output(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('no such model', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="ended before its turns(.|\n)*no such model"):
        run_in_turns({"a": [sys.executable, str(script)]}, 2, {}, str(tmp_path))


def test_a_run_that_leaves_its_turns_is_reported(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "leaves.py"
    script.write_text(_RUN.format(benchmarks=str(BENCHMARKS), turns=1))
    with pytest.raises(RuntimeError, match="the a run left its turns"):
        run_in_turns({"a": [sys.executable, str(script), "a"]}, 2, {}, str(tmp_path))
    # Its socket is gone with it.
    assert [path.name for path in tmp_path.iterdir()] == ["leaves.py"]
