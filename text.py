"""Words in messages: `an int`, `a double`, `1 epoch`, `2 epochs`. The core, so validation,
the connectors and the live display phrase counts and kinds alike."""

from __future__ import annotations


def a_noun(noun: str) -> str:
    """`noun` with its indefinite article by its first letter: `an int`, `a window`."""
    return f"an {noun}" if noun[:1].lower() in ("a", "e", "i", "o", "u") else f"a {noun}"


def plural(n: int, noun: str) -> str:
    """`1 epoch`, `2 epochs`, `1,000 dead letters`: a count and its noun."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
