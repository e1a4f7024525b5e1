"""The `sop` command line: a click group whose commands are thin wrappers over library functions.

Each command group lives in its own module and registers itself on `main` when imported.
"""

from __future__ import annotations

import click

from .. import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sop")
def main() -> None:
    """sopgraph: compile customer-service SOPs into graphs and evaluate agents on them."""


# Command modules register themselves on `main` when imported.
from . import checkcmd, lang, pathscmd, runcmd, scorecmd, synthcmd, tools  # noqa: E402,F401
