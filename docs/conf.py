"""Sphinx configuration of pydist's site: ``make docs`` builds it into build/docs/html."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "pydist"
author = "the pydist developers"
copyright = "the pydist developers"
release = version = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.viewcode", "pydist_docs"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]

# Every warning fails the build (make docs runs sphinx-build -W); nitpicky: every cross-reference
# must resolve, except to the names of other projects, listed here.
nitpicky = True
# pydist's internal types (in signatures of public methods) have no page of their own.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|concurrent|datetime|collections|typing|enum|argparse|pathlib|os|socket|abc)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|TypeAlias|Self|NoReturn|timedelta|Module)"),
    (r"py:.*", r"c10d::.*"),
    (r"py:.*", r"pydist\.(api|core|engines|groups|net|transport|store|rendezvous|torch|data|debug)\.\w+\..*"),
    (r"py:.*", r"pydist\.torch\._\w+\..*"),
    (r"py:class", r"(Engine|GroupState|ProgressBoard|World|FailurePath|OpSpec|OpContext|Buffer|Join)"),
]

# Text stays as typed: no curly quotes, and "--" stays two hyphens (docutils' smartquotes would turn
# "--nproc" in prose, the generated CLI/settings tables and the changelog into "–nproc", which a
# copied command then fails on); pages type a real dash where they mean one.
smartquotes = False

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"  # no lists of bare types
autodoc_preserve_defaults = True
add_module_names = False

html_theme = "furo"
html_title = "pydist"
html_static_path = ["_static"]
html_css_files = ["pydist.css"]
html_show_sourcelink = False
html_last_updated_fmt = None
