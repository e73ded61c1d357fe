"""The words of messages (`streamer.text`), shared by validation, connectors and display."""

from __future__ import annotations

import pytest

from streamer.text import a_noun, plural


@pytest.mark.parametrize(("noun", "phrase"), [
    ("int", "an int"), ("array<string>", "an array<string>"), ("Operator", "an Operator"),
    ("double", "a double"), ("window", "a window"), ("", "a "),
])
def test_a_noun_takes_the_article_of_its_first_letter(noun: str, phrase: str) -> None:
    assert a_noun(noun) == phrase


def test_plural_counts_with_thousands() -> None:
    assert [plural(n, "epoch") for n in (0, 1, 2, 1000)] == [
        "0 epochs", "1 epoch", "2 epochs", "1,000 epochs"]
