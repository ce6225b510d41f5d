"""Where the product keeps its state: ``$CONDUCTOR_HOME`` (default ``./.conductor``)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["conductor_home", "artifacts_location", "mlflow_tracking_uri", "models_dir"]


def conductor_home() -> Path:
    return Path(os.environ.get("CONDUCTOR_HOME") or ".conductor").expanduser()


def artifacts_location() -> str:
    """The Parquet dataset root: a local path or any URL pyarrow can write (``s3://…``).

    ``CONDUCTOR_ARTIFACTS`` overrides the default ``$CONDUCTOR_HOME/artifacts``.
    """
    explicit = os.environ.get("CONDUCTOR_ARTIFACTS")
    if explicit:
        return explicit
    return str((conductor_home() / "artifacts").absolute())


def models_dir() -> Path:
    """Cache of converted local model weights."""
    return conductor_home() / "models"


def mlflow_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///$CONDUCTOR_HOME/mlflow.db``."""
    explicit = os.environ.get("MLFLOW_TRACKING_URI")
    if explicit:
        return explicit
    home = conductor_home().absolute()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"
