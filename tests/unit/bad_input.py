"""Bad values by kind, as Python objects (for the API) and as command-line text (for the entry points).

Each strategy yields only values that must be refused: the tests assert a ValueError (or exit code 2)
whose message is one line, and a strategy that could yield a valid value would make them flaky.
"""

from __future__ import annotations

import math
import re
import signal
from contextlib import contextmanager

import numpy as np
from hypothesis import strategies as st

# Digits of other scripts: Python's int() and float() read them, no option or unit string means them.
FOREIGN_DIGITS = ["٣", "۷", "३", "৫", "๒", "１", "²", "⅕", "Ⅻ"]
JUNK = ["", " ", "abc", "1_000", "0x10", "1e", "--", "1.2.3", "nan", "inf", "-inf", "NaN", "None", "null", "true",
        "10 20", "١٠", "٣.٥", "5 ms", "3,5"]
INT_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
FLOAT_TEXT = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*", re.ASCII)
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\0"), max_size=12)


# -- Python objects -------------------------------------------------------------------
def not_values() -> st.SearchStrategy:
    """Neither a number nor a string: flags, nothing, containers, objects."""
    return st.one_of(st.booleans(), st.just(np.bool_(True)), st.none(), st.lists(st.integers(), max_size=2),
                     st.just(object()))


def not_numbers() -> st.SearchStrategy:
    return st.one_of(not_values(), st.sampled_from(JUNK + FOREIGN_DIGITS))


def bad_counts(minimum: int, maximum: int | None = None) -> st.SearchStrategy:
    """What a count >= minimum (<= maximum) must refuse: too small, too large, fractional, not finite, not a number."""
    options = [st.integers(max_value=minimum - 1), st.integers(min_value=-2**62, max_value=minimum - 1).map(np.int64),
               st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not float(x).is_integer()),
               st.sampled_from([math.nan, math.inf, -math.inf, np.float32("nan")]), not_numbers()]
    if maximum is not None:
        options.append(st.integers(min_value=maximum + 1, max_value=10**30))
    return st.one_of(options)


def bad_reals(low: float = -math.inf, high: float = math.inf, low_open: bool = False) -> st.SearchStrategy:
    """What a finite number in [low, high] ((low, high] with low_open) must refuse."""
    outside = []
    if low > -math.inf:
        outside.append(st.floats(max_value=low, exclude_max=not low_open, allow_nan=False, allow_infinity=False))
    if high < math.inf:
        outside.append(st.floats(min_value=high, exclude_min=True, allow_nan=False, allow_infinity=False))
    return st.one_of(*outside, st.sampled_from([math.nan, math.inf, -math.inf, np.float32("inf")]), not_numbers())


def bad_units(unit_re: str, low: float = 0.0, low_open: bool = True, high: float = math.inf) -> st.SearchStrategy:
    """What a size, time or bandwidth field in [low, high] must refuse: numbers outside, not finite, bad strings."""
    numbers = bad_reals(low, high, low_open).filter(lambda v: isinstance(v, float))
    return st.one_of(numbers, not_values(), bad_unit_strings(unit_re))


def bad_unit_strings(unit_re: str) -> st.SearchStrategy:
    """Strings that are neither a plain ASCII number nor ``number unit``: garbage, other scripts' digits, bad units."""
    plain = re.compile(r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*(?:" + unit_re + r")?\s*",
                       re.ASCII)
    made = st.builds(lambda d, u: d + u, st.sampled_from(FOREIGN_DIGITS), st.sampled_from(["MiB", "ms", "Gbit/s", ""]))
    return st.one_of(made, st.sampled_from(["fast", "1 parsec", "5 furlongs", "MiB", "1e999MB", "12 Kib/h"]),
                     text.filter(lambda t: not plain.fullmatch(t)))


# -- command-line text ----------------------------------------------------------------
def bad_int_text(minimum: int, maximum: int | None = None) -> st.SearchStrategy:
    def bad(t: str) -> bool:
        if not INT_TEXT.fullmatch(t):
            return True
        return int(t) < minimum or (maximum is not None and int(t) > maximum)

    numbers = st.integers(max_value=minimum - 1).map(str)
    options = [numbers, st.sampled_from(JUNK + FOREIGN_DIGITS + ["1.5", "2e3", "+", "٣٢"]), text.filter(bad)]
    if maximum is not None:
        options.append(st.integers(min_value=maximum + 1, max_value=10**40).map(str))
    return st.one_of(options)


def bad_real_text(low: float = -math.inf, high: float = math.inf, low_open: bool = False) -> st.SearchStrategy:
    def bad(t: str) -> bool:
        if not FLOAT_TEXT.fullmatch(t) or not math.isfinite(float(t)):
            return True
        value = float(t)
        return value < low or (low_open and value == low) or value > high

    return st.one_of(bad_reals(low, high, low_open).filter(lambda v: isinstance(v, float)).map(repr),
                     st.sampled_from(JUNK + FOREIGN_DIGITS), text.filter(bad))


def bad_choice_text(choices: tuple[str, ...]) -> st.SearchStrategy:
    made = st.sampled_from([c.upper() + "x" for c in choices] + JUNK)
    return st.one_of(made, text).filter(lambda t: t not in choices)


# -- the checks ----------------------------------------------------------------------
class Hang(Exception):
    pass


@contextmanager
def bounded(seconds: float):
    """Fail a call that runs longer than ``seconds`` (a refusal is instant; a hang or a huge allocation is not)."""

    def alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_one_line(message: str, *parts: str) -> None:
    assert "\n" not in message.strip(), f"not one line: {message!r}"
    assert "Traceback" not in message, message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
