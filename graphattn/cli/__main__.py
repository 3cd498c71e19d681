"""``python -m graphattn.cli``: the ``graphattn`` command."""

import sys

from graphattn.cli import main

if __name__ == "__main__":  # importing the module (documentation tools do) runs nothing
    sys.exit(main())
