"""The `sop` command line: a click group whose commands are thin wrappers over library functions.

Each command module defines its commands; this module is the one place that assembles them.
"""

from __future__ import annotations

import click

from sopgraph._version import __version__
from sopgraph.cli import authorcmd, checkcmd, draftcmd, lang, pathscmd, runcmd, scorecmd, synthcmd, tools


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sop")
def main() -> None:
    """sopgraph: compile customer-service SOPs into graphs and evaluate agents on them."""


COMMAND_MODULES = (checkcmd, lang, pathscmd, synthcmd, runcmd, scorecmd, tools, authorcmd, draftcmd)


def _top_level_commands(module: object) -> list[click.Command]:
    """The module's commands that are not subcommands of one of its groups, in definition order."""
    found = [c for c in vars(module).values() if isinstance(c, click.Command)]
    nested = {id(sub) for c in found if isinstance(c, click.Group) for sub in c.commands.values()}
    return [c for c in found if id(c) not in nested]


for _module in COMMAND_MODULES:
    for _command in _top_level_commands(_module):
        main.add_command(_command)
