"""The chief's output on the launcher's console: everything it prints goes to its log
file; the console gets the same, less TensorFlow's start-up noise."""

import os
import re
import sys
import threading
from typing import IO, Protocol

# Lines TensorFlow's C++ runtime writes as it starts (oneDNN, CUDA probing, CPU
# features), in absl's format, which TF_CPP_MIN_LOG_LEVEL does not silence before the
# runtime has read it.
_NATIVE_LOG = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ \S+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|To enable the following instructions: .* rebuild TensorFlow)"
)


def is_native_log(line: str) -> bool:
    """Whether `line` is one of TensorFlow's native log lines.

    >>> is_native_log("I0000 00:00:1796029948.995812    2411 port.cc:153] oneDNN custom operations are on.")
    True
    >>> is_native_log("Epoch 1/2")
    False
    """
    return _NATIVE_LOG.match(line) is not None


class Sink(Protocol):
    """Where output goes: a console's binary stream, or a buffer."""

    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


def relay(
    stdout: IO[bytes],
    stderr: IO[bytes],
    log: IO[bytes],
    quiet: bool,
    console: tuple[Sink, Sink] | None = None,
) -> list[threading.Thread]:
    """Copies the chief's stdout (as it comes, so progress bars move) and stderr (line by
    line, TensorFlow's native log lines left out when `quiet`) to the console, or to
    `console`'s two streams, and both whole into `log`."""
    lock = threading.Lock()
    console_out, console_err = console or (sys.stdout.buffer, sys.stderr.buffer)

    def write(data: bytes, stream: Sink) -> None:
        with lock:
            log.write(data)
            log.flush()
        stream.write(data)
        stream.flush()

    def copy_stdout() -> None:
        while chunk := os.read(stdout.fileno(), 1 << 16):
            write(chunk, console_out)

    def copy_stderr() -> None:
        for line in iter(stderr.readline, b""):
            if quiet and is_native_log(line.decode(errors="replace")):
                with lock:
                    log.write(line)
                    log.flush()
                continue
            write(line, console_err)

    threads = [threading.Thread(target=copy, daemon=True) for copy in (copy_stdout, copy_stderr)]
    for thread in threads:
        thread.start()
    return threads
