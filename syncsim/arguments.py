"""What every ``python -m`` entry point shares: bad input ends in one line and exit code 2.

argparse prints its usage and then the error; here the error alone, on one line, names the
option and the value. Numbers on the command line are ASCII: Python's int() and float() also
read other scripts' digits ("٣"), which no option means.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import NoReturn

__all__ = ["ArgumentParser", "integer", "number", "fail", "check_count", "BAD_INPUT"]

BAD_INPUT = 2  # the exit code of every refusal, as argparse's own
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _name(prog: str) -> str:
    return prog.removeprefix("python -m ")


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"{_name(self.prog)}: error: {message} (see --help)\n")


# str.strip() would also drop Unicode spaces (U+00A0 ...), which int() then accepts: ASCII only.
ASCII_SPACE = " \t\n\r\v\f"


def integer(text: str) -> int:
    """An argparse ``type``: an ASCII integer."""
    if not _INT.fullmatch(text.strip(ASCII_SPACE)):
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(text)


def number(text: str) -> float:
    """An argparse ``type``: a finite ASCII decimal number."""
    if not _FLOAT.fullmatch(text.strip(ASCII_SPACE)) or not math.isfinite(float(text)):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return float(text)


def fail(prog: str, message: object) -> int:
    """Print ``prog: error: message`` on one line and return the bad-input exit code."""
    text = " ".join(str(message).split())  # one line, whatever the message held
    print(f"{_name(prog)}: error: {text}", file=sys.stderr)
    return BAD_INPUT


def check_count(flag: str, value: int, minimum: int, maximum: int | None = None) -> int:
    """An integer option within [minimum, maximum], or ValueError naming the flag."""
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum:,}"
        raise ValueError(f"{flag} must be {allowed}, got {value:,}")
    return value
