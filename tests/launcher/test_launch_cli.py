"""`omnikeras launch` refuses bad requests before it starts anything."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "2", "--groups", "3", "x.py"], "3 groups need at least as many workers"),
        (["--workers", "0", "x.py"], "at least 1"),
        (["no-such-script.py"], "no training script at no-such-script.py"),
        (["--ray", "--emulate", "mixed", "x.py"], "an emulated cluster runs on this machine, not on Ray"),
        (["--ray", "--profile", "p.json", "x.py"], "a profile describes this machine, not a Ray cluster's nodes"),
        (["--ray-address", "127.0.0.1:1", "no-such-script.py"], "no training script at no-such-script.py"),
        (["--tls-cert", "x.py", "x.py"], "TLS needs both a certificate and a key"),
        (["--tls-ca", "x.py", "x.py"], "a CA (--tls-ca) is for the servers' certificate"),
        (["--tls-cert", "no.pem", "--tls-key", "no.pem", "x.py"], "no TLS file at no.pem"),
    ],
)
def test_bad_requests_exit_with_a_message(tmp_path, args: list[str], message: str) -> None:
    (tmp_path / "x.py").write_text("")
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--log-dir", str(tmp_path / "logs"), *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert run.returncode == 2
    assert message in run.stderr


def test_throughputs_must_be_numbers() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "omnikeras", "launch", "--throughputs", "1,fast", "x.py"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2
    assert "comma-separated numbers" in run.stderr
