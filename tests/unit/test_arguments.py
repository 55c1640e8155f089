"""syncsim.arguments: the number types every command line shares."""

import argparse

import pytest

from syncsim.arguments import integer, number


@pytest.mark.parametrize("text,value", [("3", 3), (" 2\n", 2), ("-4", -4), ("+5", 5)])
def test_an_ascii_integer_is_read(text, value):
    assert integer(text) == value


# Basis: int() and float() accept Unicode digits and strip Unicode spaces ("1\xa0", "١"), which a
# command line should refuse as the fuzz's "one line, exit 2" contract expects (tests/unit/bad_input.py).
@pytest.mark.parametrize("text", ["1\xa0", "\u2003" + "2", "\u0661", "1.0", "", "0x10"])
def test_anything_else_is_not_an_integer(text):
    with pytest.raises(argparse.ArgumentTypeError, match="not an integer"):
        integer(text)


@pytest.mark.parametrize("text", ["1.5\xa0", "nan", "inf", "1e999", "\u0661.5", ""])
def test_a_number_is_finite_and_ascii(text):
    with pytest.raises(argparse.ArgumentTypeError, match="not a finite number"):
        number(text)


def test_numbers_in_every_ascii_form_are_read():
    assert [number(t) for t in ("1", " .5", "2.", "-3e-2", "+4E1")] == [1.0, 0.5, 2.0, -0.03, 40.0]
