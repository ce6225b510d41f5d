"""The CLI as a new user runs it, for the CLI tests: a fresh home under the test's
temp directory, no Prefect server, no MLflow server and no API key from the outer shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root (tests/ is one below it)


def run_cli(tmp_path: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """``python -m prefect_conductor.cli.app ARGS`` in ``tmp_path`` with ``CONDUCTOR_HOME=tmp_path/home``."""
    env = {**os.environ, "CONDUCTOR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    for key in [k for k in env if k.endswith("_API_KEY")]:
        env.pop(key)  # proves no key is needed
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "prefect_conductor.cli.app", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
