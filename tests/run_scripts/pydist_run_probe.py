"""A module for ``pydist-run -m pydist_run_probe ARGS``: prints its __name__, argv and rank."""
import json
import os
import sys

print("MODULE " + json.dumps({"name": __name__, "argv": sys.argv[1:], "rank": os.environ["RANK"]}))
