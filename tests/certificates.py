"""A self-signed TLS certificate for 127.0.0.1, for the tests that serve TLS."""

import pathlib
import shutil
import subprocess

import pytest


def self_signed(directory: pathlib.Path) -> tuple[str, str]:
    """(certificate, key) PEM files for localhost and 127.0.0.1; skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return str(cert), str(key)
