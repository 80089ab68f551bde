"""``python -m pydist.bench``: the same as the ``pydist-bench`` console script."""
import sys

from .cli import main

sys.exit(main())
