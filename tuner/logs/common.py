"""What every log parser shares: comment-free lines and the warm-up-free median step time."""

from __future__ import annotations

import re
import statistics


def lines(text: str) -> list[str]:
    """The log's lines without comment lines (`# ...`, as fixtures and notes carry)."""
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def median_after_warmup(values: list[float]) -> float:
    """The median of logged values after the first (the warm-up step, or the first log interval)."""
    if not values:
        raise ValueError("no step time in the log")
    return float(statistics.median(values[1:] if len(values) > 1 else values))


def number(text: str) -> float:
    """A logged number: thousands separators allowed ("5,615")."""
    return float(text.replace(",", ""))


DOTTED = re.compile(r"(?:^|\s)([A-Za-z_][\w]*) ?\.{2,} (\S.*?)\s*$")
"""`name ....... value` (Megatron's argument dump, DeepSpeed's configuration print); long names are
followed by two spaces instead of dots in DeepSpeed's, which `SPACED` reads."""
SPACED = re.compile(r"\]\s{2,}([A-Za-z_]\w*)\s{2,}(\S.*?)\s*$")


def dotted_values(text_lines: list[str]) -> dict[str, str]:
    """Every `name ..... value` pair (the first occurrence of a name wins: one run per log)."""
    out: dict[str, str] = {}
    for line in text_lines:
        m = DOTTED.search(line) or SPACED.search(line)
        if m and m.group(1) not in out:
            value = re.sub(r"\.{3,}\s*(default|updated)\s*$", "", m.group(2)).strip()
            out[m.group(1)] = value
    return out
