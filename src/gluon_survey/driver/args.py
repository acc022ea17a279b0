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
