"""Text that reads at 80 columns: prose wrapped at spaces, commands to copy never broken inside a word.

A command longer than the line is split between its arguments with a shell continuation (` \\`), so what is
on the screen still pastes and runs as one command.
"""

from __future__ import annotations

import re
import textwrap

# Where a command starts inside a fix text: at the start, or after ": " / "; " / "run ".
_COMMAND_START = re.compile(
    r"(?:^|(?<=: )|(?<=; )|(?<=run ))"
    r"(?=(?:sudo|python3?|pip3?|conda|mamba|uv|export|unset|docker|apt-get|apt|nvidia-smi|ln|rm|mv|mkdir|cd|hf|"
    r"huggingface-cli|gpuready|torchrun|accelerate|rsync|rclone)\b[ ])"
)
_TOKEN = re.compile(r"""(?:'[^']*'|"[^"]*"|[^\s'"])+""")


def split_fix(text: str) -> tuple[str, str | None]:
    """(prose, command): the command is the tail of `text` from the first place a command starts."""
    match = _COMMAND_START.search(text)
    if match is None:
        return text, None
    prose = text[: match.start()].rstrip()
    return prose, text[match.start() :].strip()


def command_lines(command: str, width: int, indent: str = "") -> list[str]:
    """The command on lines of at most `width` (where its words allow), continued with ` \\`."""
    tokens = _TOKEN.findall(command)
    lines: list[str] = []
    current = indent
    for token in tokens:
        candidate = token if current.strip() == "" else f"{current} {token}"
        if current.strip() and len(candidate) + 2 > width:  # room for " \"
            lines.append(current + " \\")
            current = indent + "  " + token
        else:
            current = candidate if current.strip() else indent + token
    if current.strip():
        lines.append(current)
    return lines


def fix_lines(text: str, width: int, indent: str = "") -> list[str]:
    """A fix: its prose wrapped at spaces, then its command on lines of its own, never broken in a word."""
    prose, command = split_fix(text)
    out: list[str] = []
    if prose:
        out += textwrap.wrap(
            prose,
            width=width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    if command:
        out += command_lines(command, width, indent + ("  " if prose else ""))
    return out


def wrap(text: str, width: int, indent: str = "", first: str | None = None, keep: tuple[str, ...] = ()) -> list[str]:
    """Prose at `width`, words whole (a path longer than the line stays whole on its own line); the phrases in
    `keep` (GPU names such as "V100 SXM2 16GB") are not broken at their spaces either."""
    nbsp = "\u00a0"  # textwrap breaks only at ASCII whitespace
    for phrase in sorted(keep, key=len, reverse=True):
        if " " in phrase:
            text = text.replace(phrase, phrase.replace(" ", nbsp))
    lines = textwrap.wrap(
        text,
        width=width,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent if first is None else first]
    return [line.replace(nbsp, " ") for line in lines]
