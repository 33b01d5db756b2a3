"""``python -m draftmeta``: the same as the ``draftmeta`` command."""

import sys

from draftmeta.cli import main

sys.exit(main())
