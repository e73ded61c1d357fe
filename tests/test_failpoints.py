"""Fail points that stall (`sleep=` for a while, `pause=` until the test lets the run go on) or
raise once (`raise`); the kill action is exercised by the crash tests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from streamer import failpoints


def test_sleep_stalls_from_the_given_number_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, "epoch-start:3:sleep=0.3,other:0")
    started = time.monotonic()
    failpoints.reached("epoch-start", 2)
    failpoints.reached("not-armed", 9)
    assert time.monotonic() - started < 0.2
    failpoints.reached("epoch-start", 3)
    assert time.monotonic() - started >= 0.3


def test_pause_holds_until_the_gate_exists(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    monkeypatch.setenv(failpoints.ENV, f"starting:0:pause={gate}")
    released: list[float] = []
    held = threading.Thread(target=lambda: (failpoints.reached("starting"),
                                            released.append(time.monotonic())))
    held.start()
    deadline = time.monotonic() + 10
    while not Path(f"{gate}.reached").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert Path(f"{gate}.reached").exists()
    time.sleep(0.2)
    assert not released  # still held
    opened = time.monotonic()
    gate.touch()
    held.join(timeout=5)
    assert released and released[0] >= opened
    failpoints.reached("starting")  # once open, it stays open


def test_raise_fails_once_per_process_from_the_given_number_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "_raised", set())
    monkeypatch.setenv(failpoints.ENV, "epoch-start:3:raise")
    failpoints.reached("epoch-start", 2)
    with pytest.raises(failpoints.FailPointError, match="'epoch-start' reached at 4"):
        failpoints.reached("epoch-start", 4)
    failpoints.reached("epoch-start", 4)  # the restart's second try goes on
    failpoints.reached("epoch-start", 5)
