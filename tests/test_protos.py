"""The checked-in stubs are exactly what `make protos` generates from `protos/`."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_generated_stubs_are_up_to_date(tmp_path: pathlib.Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "generate_protos.py"), "--out", str(tmp_path)],
        check=True, capture_output=True,
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "omnikeras" / "v1").glob("*_pb2*")}
    checked_in = {p.name: p.read_bytes() for p in (ROOT / "omnikeras" / "v1").glob("*_pb2*")}
    assert fresh.keys() == checked_in.keys()
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert not stale, f"run `make protos`: {stale} are out of date"
