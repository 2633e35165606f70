"""``python -m corral.testing.firecracker``: run the Firecracker test double."""

import sys

from corral.testing.firecracker.server import main

sys.exit(main())
