"""``python -m pydist.debug DIR [FILE...]``: analyze the ranks' flight-recorder files.

Prints, per group, each rank's last started and completed sequence number, then the ranks
whose calls differ at one sequence number, the ranks behind, the ranks stuck in an
operation, and the failed operations (see ``pydist.debug.analyze``). ``--json`` prints the
findings as JSON. Exit status 0, or 2 when no trace file is found.
"""
from __future__ import annotations

import argparse
import json
import sys

from .analyze import as_json, main_text


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (the docs' CLI reference is made from it)."""
    parser = argparse.ArgumentParser(prog="python -m pydist.debug",
                                     description="Analyze pydist flight-recorder traces (PYDIST_TRACE_DIR).")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a directory of pydist_trace_rank*.json files, or trace files")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.json:
            print(json.dumps(as_json(args.paths), indent=1))
        else:
            print(main_text(args.paths))
    except FileNotFoundError as error:
        print(f"python -m pydist.debug: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
