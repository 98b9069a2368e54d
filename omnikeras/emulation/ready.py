"""Waits until training can start on a cluster: every worker has joined the parameter
servers and the model is initialised. Run inside an emulated cluster's namespace, where
the servers are; exits 0 then, or 1 after `--timeout` seconds.

    python -m omnikeras.emulation.ready --workers 5 127.0.0.1:41234
"""

import argparse
import os
import sys
import time

from omnikeras.parameter_server import ParameterServerClient


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("addresses", nargs="+")
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    with ParameterServerClient(args.addresses, token=os.environ.get("OMNIKERAS_TOKEN"), retry_seconds=args.timeout) as client:
        while time.monotonic() < deadline:
            joined = sum(len(group.members) for group in client.stats()[0].groups)
            if joined >= args.workers and client.describe().model_initialized:
                return 0
            time.sleep(0.2)
    return 1


if __name__ == "__main__":
    sys.exit(main())
