"""The emulated cluster needs root and kernel features, which CI's machines have."""

import pytest

from omnikeras.emulation import ClusterSpec, missing_requirements

MISSING = missing_requirements(ClusterSpec.load("mixed"))
needs_emulation = pytest.mark.skipif(bool(MISSING), reason=f"cannot emulate here: {'; '.join(MISSING)}")
