"""`sop draft`: a model drafts a `.sop` from a prose policy (check -> repair rounds)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import click

from sopgraph.authoring.draft import (
    DEFAULT_MAX_ANSWER_CHARS,
    DEFAULT_ROUNDS,
    DraftError,
    draft,
    render_summary,
)
from sopgraph.simulation.gateway import Gateway, InfraFailure, ModelOptionError, parse_model_option

from .params import fail, write_output


@click.command("draft")
@click.argument("policy", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", "model_option", required=True, metavar="author=MODEL[,key=value...]",
              help="The drafting model, e.g. author=openai/gpt-4o,temperature=0 (offline: author=scripted/author).")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the draft here (NAME.sop) instead of stdout.")
@click.option("--rounds", default=DEFAULT_ROUNDS, show_default=True, type=click.IntRange(1, 20),
              help="Model replies at most: the first draft plus repair rounds.")
@click.option("--name", default=None, help="Scenario name (default: the output file's stem, else the policy's).")
@click.option("--max-answer-chars", default=DEFAULT_MAX_ANSWER_CHARS, show_default=True,
              type=click.IntRange(1_000, 50_000_000),
              help="Longest model answer used; a longer one is neither written nor sent back (the model is "
                   "asked for a shorter one).")
@click.option("--no-cache", is_flag=True, help="Do not use the response cache.")
def draft_cmd(policy: Path, model_option: str, out: Path | None, rounds: int, name: str | None,
              max_answer_chars: int, no_cache: bool) -> None:
    """Draft a `.sop` from the prose POLICY with a language model, then feed the checker's diagnostics
    back until the program is clean or --rounds replies were used. Each stage cites the policy lines it
    comes from (`# POLICY.md:LINE`); ambiguities are left as `# QUESTION:` comments.

    The model's answer is capped (--max-answer-chars) and stripped of terminal escapes and control
    characters before it is checked or written.

    Exit status: 0 clean draft, 1 written but still with checker errors, 2 bad input, model failure, or
    every answer over the cap.
    """
    try:
        text = policy.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {policy}: {getattr(exc, 'strerror', None) or exc}", 2)
    try:
        spec = parse_model_option(model_option if "=" in model_option.split(",")[0] else f"author={model_option}")
    except ModelOptionError as exc:
        fail(str(exc), 2)
    if spec.role != "author":
        fail(f"--model {model_option!r}: the drafting role is `author` (author=MODEL)", 2)
    stem = name or (out.stem if out is not None else policy.stem)
    scenario_name = re.sub(r"\W+", "_", stem).strip("_") or "draft"
    try:
        result = asyncio.run(draft(text, spec, gateway=Gateway(cache=not no_cache), policy_file=policy.name,
                                   name=scenario_name, max_rounds=rounds, max_answer_chars=max_answer_chars))
    except InfraFailure as exc:
        fail(f"the model could not be reached: {exc}", 2)
    except DraftError as exc:
        fail(str(exc), 2)
    write_output(result.text, out)
    click.echo(render_summary(result, out), err=True, nl=False)
    sys.exit(0 if result.clean else 1)
