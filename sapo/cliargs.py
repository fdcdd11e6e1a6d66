"""argparse types shared by the `sapo` subcommands: a bad value is a usage error naming the flag."""

from __future__ import annotations

import argparse
import math


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def positive_seconds(value: str) -> float:
    """A finite duration above 0: a negative wait was taken as "forever" by the Kafka client."""
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {value}")
    return number
