"""The chief's output: whole in its log, on the console without TensorFlow's start-up."""

import subprocess
import sys

from omnikeras.processes.console import is_native_log, relay

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796039345.235730    2188 port.cc:153] oneDNN custom operations are on.",
    "E0000 00:00:1796039348.361002    2188 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
]


def test_native_lines_are_told_from_the_script_s_own() -> None:
    assert all(is_native_log(line) for line in NOISE)
    for line in ("Epoch 1/2", "Traceback (most recent call last):", "ValueError: I0000 is not a number", "omnivore phase 0: ..."):
        assert not is_native_log(line)


def test_the_console_gets_the_script_s_lines_and_the_log_gets_all(tmp_path, capfdbinary) -> None:
    script = "import sys\n" + "".join(f"print({line!r}, file=sys.stderr)\n" for line in NOISE) + (
        "print('Epoch 1/1')\nsys.stdout.write('\\r3/3 progress')\nsys.stdout.flush()\nprint('trouble', file=sys.stderr)\n"
    )
    with open(tmp_path / "chief.log", "wb") as log:
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for thread in relay(child.stdout, child.stderr, log, quiet=True):
            thread.join(30)
        child.wait()
    console = capfdbinary.readouterr()
    assert console.out == b"Epoch 1/1\n\r3/3 progress"
    assert console.err == b"trouble\n"
    logged = (tmp_path / "chief.log").read_text()
    assert all(line in logged for line in NOISE) and "trouble" in logged and "3/3 progress" in logged
