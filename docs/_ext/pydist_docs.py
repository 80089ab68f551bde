"""The site's generated parts and its checks (a Sphinx extension; also ``python docs/_ext/pydist_docs.py``).

Generated at build time, never copied into the pages:

- ``<!-- pydist:settings -->`` becomes the list of PYDIST_* variables (``pydist.core.settings.markdown()``);
- ``<!-- pydist:cli MODULE:FUNCTION -->`` becomes the usage and options of the argparse parser
  that ``FUNCTION()`` builds;
- ``<!-- pydist:changelog -->`` becomes the commit subjects of ``git log``, by day.

Checks that fail the build: a public name of ``API_MODULES`` (and a public method or property
of a public class) without a docstring, and a public name that no API page documents.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: The modules whose ``__all__`` is the public API the reference documents.
API_MODULES = ("pydist", "pydist.store", "pydist.data", "pydist.torch", "pydist.torch.ddp", "pydist.torch.hooks",
               "pydist.debug")


def public_names() -> Iterator[tuple[str, Any]]:
    """(qualified name, object) of every public function and class of API_MODULES, and of
    the public methods and properties those classes define themselves."""
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue  # constants carry no docstring of their own; the pages describe them
            yield f"{module_name}.{name}", obj
            if inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    if not attr.startswith("_") and (callable(value) or isinstance(value, (property, classmethod,
                                                                                            staticmethod))):
                        yield f"{module_name}.{name}.{attr}", value


def _doc(obj: Any) -> str | None:
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    return obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)


def missing_docstrings() -> list[str]:
    """The public names without a docstring."""
    return [name for name, obj in public_names() if not (_doc(obj) or "").strip()]


# -- generated text ------------------------------------------------------------------------------

def settings_list() -> str:
    """``pydist.core.settings.markdown()``'s table as a definition list (a four-column table
    does not fit a phone)."""
    from pydist.core.settings import markdown
    entries = []
    for row in markdown().splitlines()[2:]:
        variable, default, valid, meaning = (cell.strip() for cell in row.strip("|").split(" | "))
        entries.append(f"{variable}\n: {meaning}\n\n  Default: {default}. Valid: {valid}.\n")
    return "\n".join(entries)


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    spellings = [n for n in action.option_strings if n.replace("_", "-") == n or n.replace("_", "-") not in
                 action.option_strings]  # --nproc_per_node: the page says once that underscores work too
    names = ", ".join(f"`{name}`" for name in spellings) or f"`{action.metavar or action.dest}`"
    if action.nargs != 0 and action.option_strings:
        names += f" `{action.metavar or action.dest.upper()}`"
    text = parser._get_formatter()._expand_help(action) if action.help else ""  # argparse's own %(default)s
    if action.choices:
        text += f" (one of: {', '.join(map(str, action.choices))})"
    return f"| {names} | {text.replace('|', '/').replace('*', chr(92) + '*')} |"


def cli_reference(target: str) -> str:
    """Usage and options of the parser that ``module:function`` builds, as markdown."""
    module_name, function = target.split(":")
    parser = getattr(importlib.import_module(module_name), function)()
    usage = re.sub(r"\n\s+", "\n    ", parser.format_usage().removeprefix("usage: ").strip())  # narrow screens
    rows = ["| argument | meaning |", "|---|---|"]
    rows += [_option_row(parser, action) for action in parser._actions if action.help != argparse.SUPPRESS]
    return "\n".join([f"```text\n{usage}\n```", "", parser.description or "", "", *rows])


def changelog() -> str:
    """The commit subjects, newest day first."""
    lines = subprocess.run(["git", "log", "--no-merges", "--format=%ad%x09%s", "--date=short"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    out: list[str] = []
    for line in lines:
        day, subject = line.split("\t", 1)
        if f"## {day}" not in out:
            out += ["", f"## {day}", ""]
        out.append(f"- {_escape(subject)}")
    return "\n".join(out)


def _escape(text: str) -> str:
    return re.sub(r"([*_`<>\[\]])", r"\\\1", text)


MARKERS = {
    re.compile(r"<!-- pydist:settings -->"): lambda match: settings_list(),
    re.compile(r"<!-- pydist:cli ([\w.]+:\w+) -->"): lambda match: cli_reference(match.group(1)),
    re.compile(r"<!-- pydist:changelog -->"): lambda match: changelog(),
}


def expand(text: str) -> str:
    for pattern, make in MARKERS.items():
        text = pattern.sub(make, text)
    return text


# -- Sphinx hooks ----------------------------------------------------------------------------------

def _on_source_read(app: Any, docname: str, source: list[str]) -> None:
    source[0] = expand(source[0])


#: How users spell a reduce op: the defaults in the sources name the enum (``RedOpType.SUM``,
#: which ``ReduceOp.SUM`` is), the pages show torch's spelling.
_ENUM_OP = re.compile(r"\bRedOpType\.(?=[A-Z])")


def users_spelling(signature: str | None) -> str | None:
    """``signature`` with every ``RedOpType.X`` default written ``ReduceOp.X``."""
    return None if signature is None else _ENUM_OP.sub("ReduceOp.", signature)


def _on_process_signature(app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None,
                          return_annotation: str | None) -> tuple[str | None, str | None]:
    return users_spelling(signature), return_annotation


def _on_builder_inited(app: Any) -> None:
    missing = missing_docstrings()
    if missing:
        raise RuntimeError("public names without a docstring (add one in src):\n  " + "\n  ".join(missing))


def _resolve(name: str) -> Any:
    """The object a documented dotted name stands for (None if it cannot be found)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            obj = vars(obj).get(part) if inspect.isclass(obj) else getattr(obj, part, None)
        return obj
    return None


def _on_consistency(app: Any, env: Any) -> None:
    """Warn (an error under -W) for a public name that no page documents, under any of its names."""
    from sphinx.util import logging
    documented = {id(_resolve(name)) for name in env.domaindata["py"]["objects"]}
    for name, obj in public_names():
        if id(obj) not in documented:
            logging.getLogger(__name__).warning("public name %s is on no API page (docs/api/)", name)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    app.connect("source-read", _on_source_read)
    app.connect("autodoc-process-signature", _on_process_signature)
    app.connect("env-check-consistency", _on_consistency)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    missing = missing_docstrings()
    print("\n".join(missing) or f"every public name has a docstring ({sum(1 for _ in public_names())} names)")
    sys.exit(1 if missing else 0)
