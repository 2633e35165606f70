"""Test helpers shipped with Corral.

===============  ===================================================================================================
``conformance``  the provider conformance suite every backend runs (exported here)
``firecracker``  a test double of the firecracker binary that enforces its API (no KVM needed);
                 ``python -m corral.testing.firecracker``
``microvm``      helpers for microVM tests: network namespaces, host leftover checks, a manager over the double
===============  ===================================================================================================

Importing this package needs pytest (the ``dev`` extra).
"""

import pytest

# Plain asserts in the suite get pytest's detailed failure messages; this must run before the module is imported.
pytest.register_assert_rewrite("corral.testing.conformance")

from corral.testing.conformance import ProviderConformance, SpecFactory, WorkspaceTracker  # noqa: E402

__all__ = ["ProviderConformance", "SpecFactory", "WorkspaceTracker"]
