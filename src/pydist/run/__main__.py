"""``python -m pydist.run``: the same as the ``pydist-run`` console script."""
from pydist.run.cli import main

if __name__ == "__main__":
    main()
