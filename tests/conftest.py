"""Test setup: offline, a temp CONDUCTOR_HOME, the fake provider, one Prefect harness.

The Prefect harness is session-scoped and started lazily, only by tests that ask for the
``prefect`` fixture, so unit tests never pay for the server start.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")

import pytest  # noqa: E402

from prefect_conductor.testing.fakes import CALLS, register_fake_provider  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _session_home():
    """A session-wide CONDUCTOR_HOME and model cache so no test writes into the working tree
    or the user's own home and cache."""
    with tempfile.TemporaryDirectory(prefix="conductor-home-") as home:
        os.environ["CONDUCTOR_HOME"] = home
        os.environ["CONDUCTOR_CACHE"] = home
        yield Path(home)


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    """A fresh CONDUCTOR_HOME (and model cache, ``models/`` below it) for one test."""
    monkeypatch.setenv("CONDUCTOR_HOME", str(tmp_path))
    monkeypatch.setenv("CONDUCTOR_CACHE", str(tmp_path))
    monkeypatch.delenv("CONDUCTOR_ARTIFACTS", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def prefect():
    """One Prefect test harness (temporary database, ephemeral server) for the session."""
    from prefect.testing.utilities import prefect_test_harness

    from prefect_conductor.runtime.server import STARTUP_TIMEOUT_S, local_run_settings

    # The product's own generous wait: a loaded CI machine is slow, not broken (issue #17).
    with prefect_test_harness(server_startup_timeout=STARTUP_TIMEOUT_S), local_run_settings():
        yield


@pytest.fixture()
def fake_provider():
    register_fake_provider()
    CALLS.clear()
    return CALLS


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer, saved as an HF model directory."""
    from prefect_conductor.testing.tiny import build_tiny_base

    return build_tiny_base(tmp_path_factory.mktemp("tiny-base"))
