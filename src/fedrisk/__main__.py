"""``python -m fedrisk`` runs the command line (see :mod:`fedrisk.cli`)."""

import sys

from fedrisk.cli import main

sys.exit(main())
