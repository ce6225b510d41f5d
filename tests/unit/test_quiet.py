"""Third-party notices and progress bars are configured off by defaults a user can override,
and libraries' deprecation warnings hidden (issue #10); the CLI applies all of it at start."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

from flows.quiet import hide_deprecation_warnings, progress_bars_off, quiet_third_party_notices


def test_notices_are_off_by_default_and_a_users_setting_wins():
    env = {"MLFLOW_LOGGING_LEVEL": "DEBUG"}
    quiet_third_party_notices(env)
    assert env["MLFLOW_LOGGING_LEVEL"] == "DEBUG"
    assert env["PREFECT_LOGGING_LEVEL"] == "WARNING"
    # The runs' own progress keeps INFO.
    assert env["PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL"] == "INFO"
    assert env["PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL"] == "INFO"


def test_progress_bars_off_covers_tqdm_and_hugging_face():
    env: dict[str, str] = {}
    progress_bars_off(env)
    assert env["TQDM_DISABLE"] == "1"
    assert env["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


def test_deprecations_are_hidden_and_other_warnings_show():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_deprecation_warnings()
        warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("old", DeprecationWarning, stacklevel=1)
        warnings.warn("look at this", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["look at this"]


def test_the_settings_reach_prefect_mlflow_and_tqdm():
    """In a fresh interpreter, as the CLI sets them: each library reads them once."""
    code = """
import logging, sys
from flows.quiet import progress_bars_off, quiet_third_party_notices
quiet_third_party_notices()
progress_bars_off()
import mlflow, tqdm
from prefect import flow  # sets Prefect's logging up
level = lambda name: logging.getLogger(name).getEffectiveLevel()
print(level("prefect"), level("prefect.flow_runs"), level("prefect.task_runs"),
      level("mlflow.store.db.utils"), level("alembic"), tqdm.tqdm(range(1)).disable)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_LOGGING", "MLFLOW_"))}
    env.pop("TQDM_DISABLE", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    w, i = logging.WARNING, logging.INFO
    assert out.stdout.split() == [str(w), str(i), str(i), str(w), str(w), "True"]
