"""The quiet settings of ``prefect_conductor.runtime.quiet`` reach each library (issue #10): in a fresh interpreter,
as the CLI sets them at start, Prefect, MLflow and tqdm each read them once. The settings
themselves are ``tests/unit/test_quiet.py``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys


def test_the_settings_reach_prefect_mlflow_and_tqdm():
    """In a fresh interpreter, as the CLI sets them: each library reads them once."""
    code = """
import logging, sys
from prefect_conductor.runtime.quiet import progress_bars_off, quiet_third_party_notices
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
