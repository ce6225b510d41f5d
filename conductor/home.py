"""Where the product keeps its state: ``$CONDUCTOR_HOME`` (default ``./.conductor``).

The home is resolved to an absolute path when it is read, so every path below it stays
valid whatever directory a later step (a Prefect task, MLflow) runs in.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "artifacts_location",
    "conductor_home",
    "mlflow_artifacts_dir",
    "mlflow_tracking_uri",
    "models_dir",
]


def conductor_home() -> Path:
    """``$CONDUCTOR_HOME``, else ``./.conductor``: absolute, ``~`` expanded."""
    return Path(os.environ.get("CONDUCTOR_HOME") or ".conductor").expanduser().absolute()


def artifacts_location() -> str:
    """The Parquet dataset root: a local path or any URL pyarrow can write (``s3://…``).

    ``CONDUCTOR_ARTIFACTS`` overrides the default ``$CONDUCTOR_HOME/artifacts``.
    """
    explicit = os.environ.get("CONDUCTOR_ARTIFACTS")
    if explicit:
        return explicit
    return str(conductor_home() / "artifacts")


def models_dir() -> Path:
    """Cache of converted local model weights."""
    return conductor_home() / "models"


def mlflow_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///$CONDUCTOR_HOME/mlflow.db``."""
    explicit = os.environ.get("MLFLOW_TRACKING_URI")
    if explicit:
        return explicit
    home = conductor_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


def mlflow_artifacts_dir() -> Path:
    """Artifacts of MLflow runs tracked in a local store (not a tracking server)."""
    return conductor_home() / "mlartifacts"
