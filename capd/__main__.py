"""``python -m capd``: the ``capd`` command."""

import sys

from capd.sidecar.client.cli import main

sys.exit(main())
