"""Every entrypoint of deployments/prefect.yaml resolves as a worker resolves it: in a fresh
process, in a temporary directory, without this checkout on PYTHONPATH, to the same module of
the installed package. The entrypoints themselves are ``tests/unit/test_deployments.py``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PREFECT_YAML = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"


def _deployments() -> list[dict]:
    return yaml.safe_load(PREFECT_YAML.read_text())["deployments"]


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_an_entrypoint_resolves_in_a_process_elsewhere(deployment, tmp_path):
    module = deployment["entrypoint"].partition(":")[0]
    spec = importlib.util.find_spec(module)
    assert spec is not None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import importlib.util as u; print(u.find_spec({module!r}).origin)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == spec.origin
