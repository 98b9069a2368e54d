"""`omnikeras launch --tls-cert --tls-key`: the servers serve TLS, the workers trust it."""

import pathlib
import subprocess
import sys

import pytest
from certificates import self_signed
from cluster_results import result_of

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "strategy" / "cluster_script.py"
pytestmark = pytest.mark.slow


def test_a_local_run_with_a_certificate_trains_over_tls(tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), "--workers", "2",
         "--tls-cert", cert, "--tls-key", key, str(SCRIPT), "--epochs", "2"],
        capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "with TLS" in (tmp_path / "logs" / "ps-0.log").read_text()
    assert result_of(run.stdout)["steps"] > 0
