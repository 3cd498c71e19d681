"""``python -m graphattn.cli``: the ``graphattn`` command."""

import sys

from graphattn.cli import main

sys.exit(main())
