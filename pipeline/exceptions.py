"""Errors raised while reading, validating and compiling a pipeline file."""

from __future__ import annotations

from dataclasses import dataclass

from streamer.exceptions import StreamerError


@dataclass(frozen=True, order=True)
class Location:
    """A position in a pipeline file; line and col are 1-based, as editors show them."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a pipeline file, with where it is and how to fix it."""

    location: Location
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


class PipelineError(StreamerError):
    """Raised when a pipeline file is invalid.

    Carries every problem found (not just the first), each as `file:line:col: message`; fix
    them in the file and run `streamer validate FILE` again.
    """

    def __init__(self, problems: list[Problem]) -> None:
        # A value shared through an alias is checked once per use; report it once.
        self.problems = sorted(set(problems), key=lambda p: (p.location, p.message))
        super().__init__("\n".join(str(p) for p in self.problems))


class PipelineFileError(StreamerError):
    """Raised when a pipeline file cannot be read at all; check the path and permissions."""


class ScaffoldError(StreamerError):
    """Raised when `streamer init` cannot create a project: the name is not a job name, or
    some of its files already exist (nothing is overwritten); pick another name or
    directory, or move the files away."""
