"""The number types of the driver's command lines (argparse `type=`), written once: a value that
does not parse or is out of range is a usage error that names it."""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type) -> float:
    try:
        return kind(text)
    except ValueError:
        return math.nan


def positive(text: str) -> float:
    """A number > 0."""
    if not _number(text, float) > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return float(text)


def non_negative(text: str) -> float:
    """A number >= 0."""
    if not _number(text, float) >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return float(text)


def positive_int(text: str) -> int:
    """A whole number > 0."""
    if not _number(text, int) >= 1:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return int(text)


def non_empty(text: str) -> str:
    """Any text but an empty one (or only blanks): `--k ""` is a mistake, not a request for the
    default."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "expected a value, got an empty string (leave the option out for its default)"
        )
    return text
