"""A fake clock for tests that are about waiting: no test asserts on wall-clock time.

:class:`FakeClock` stands in for the ``time`` module of the code under test
(``clock.install(monkeypatch, module)`` replaces that module's ``time``): ``monotonic`` and
``perf_counter`` read :attr:`FakeClock.now`, which moves only when the code
calls ``sleep`` (recorded in :attr:`FakeClock.sleeps`) or the test calls :meth:`advance`.
Whatever else the module takes from ``time`` (``time.time`` for timestamps included) is the
real thing.

Code that waits on a condition variable with a timeout (``MicroBatcher``) keeps spinning
until the test moves the clock; :meth:`wait_for` lets the test wait, without timing
anything, until a thread has read the clock at the time it set (:meth:`read_by`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

__all__ = ["FakeClock"]


class FakeClock:
    """``time.monotonic``/``perf_counter`` and ``sleep`` on a clock the test drives."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.reads: list[tuple[str, float]] = []  # (thread name, time read), in order
        self._changed = threading.Condition()

    def monotonic(self) -> float:
        with self._changed:
            self.reads.append((threading.current_thread().name, self.now))
            self._changed.notify_all()
            return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        with self._changed:
            self.sleeps.append(seconds)
            self.now += max(0.0, seconds)

    def advance(self, seconds: float) -> None:
        with self._changed:
            self.now += seconds

    @property
    def slept(self) -> float:
        return sum(self.sleeps)

    def read_by(self, thread: str, at: float) -> bool:
        """Whether ``thread`` has read the clock while it showed ``at``."""
        with self._changed:
            return (thread, at) in self.reads

    def wait_for(self, seen: Callable[[], bool], what: str, timeout: float = 30) -> None:
        """Block until ``seen()``, checked at each read of the clock and every 10 ms. The
        timeout only stops a broken test from hanging; nothing is timed."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not seen():
                if time.monotonic() > deadline:
                    raise AssertionError(f"never happened: {what} (last reads {self.reads[-5:]})")
                self._changed.wait(0.01)

    def install(self, monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> FakeClock:
        """Make this clock the ``time`` of each of ``modules`` for the test."""
        for module in modules:
            monkeypatch.setattr(module, "time", _TimeModule(self))
        return self


class _TimeModule:
    """The ``time`` module, but for the clock functions :class:`FakeClock` fakes."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        if name in ("monotonic", "perf_counter", "sleep"):
            return getattr(self._clock, name)
        return getattr(time, name)
