"""A script run as `python train.py`, without `omnikeras launch`, trains as the one worker
of a cluster of its own: develop with `python`, scale with `omnikeras launch`."""

import atexit
import logging
import tempfile

from omnikeras.config import WorkerConfig
from omnikeras.processes import start_parameter_server

logger = logging.getLogger(__name__)


def own_cluster() -> WorkerConfig:
    """Starts a parameter server for this process alone (it stops when the process ends,
    however it ends) and returns the place of this process's single worker."""
    log = tempfile.NamedTemporaryFile("w", prefix="omnikeras-ps-", suffix=".log", delete=False)
    server, address = start_parameter_server(["--groups", "1"], log, die_with_parent=True)
    atexit.register(server.terminate)
    logger.warning(
        "no cluster configured (OMNIKERAS_CONFIG or TF_CONFIG): training as a single worker "
        "against a parameter server of its own at %s (log: %s); `omnikeras launch` runs more workers",
        address, log.name,
    )
    return WorkerConfig((address,))
