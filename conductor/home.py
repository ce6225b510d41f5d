"""Where the product keeps its state, and where it caches models (issue #16).

- **Home**: ``$CONDUCTOR_HOME``, else ``~/.conductor``, one per user as ``~/.prefect`` is.
  It holds ``artifacts/`` (Parquet), ``mlflow.db``, ``mlartifacts/``, ``results/``,
  ``logs/``, ``training/`` and downloads of registered models (``models/registry``).
  A project-local home is one variable away: ``CONDUCTOR_HOME=.conductor``.
- **Model cache**: ``$CONDUCTOR_CACHE``, else ``$XDG_CACHE_HOME/conductor``, else
  ``~/.cache/conductor``: the dense weights converted once from the GGUF (``models/``).
  It does not depend on the home or the working directory, as the Hugging Face cache does
  not, so changing either never converts the model again.

Migration: versions before 0.2 defaulted to ``./.conductor``. When ``CONDUCTOR_HOME`` is
unset and the working directory holds such a home with data in it, that home stays in use,
and ``legacy_home_notice`` says so (once per home).

Paths are absolute when they are read, so every path below them stays valid whatever
directory a later step (a Prefect task, MLflow) runs in.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "artifacts_location",
    "conductor_home",
    "default_home",
    "legacy_home_notice",
    "mlflow_artifacts_dir",
    "mlflow_tracking_uri",
    "model_cache_dir",
    "models_dir",
]

#: What makes ``./.conductor`` a home of an earlier version rather than an empty directory.
_HOME_CONTENTS = ("artifacts", "mlflow.db", "models", "results")
_NOTICE_MARKER = ".home-notice"


def default_home() -> Path:
    """``~/.conductor``: the per-user home when ``CONDUCTOR_HOME`` is unset."""
    return Path.home() / ".conductor"


def _legacy_home() -> Path | None:
    """``./.conductor`` if it is a home with data and not the per-user home itself."""
    local = Path(".conductor").absolute()
    if local == default_home() or not local.is_dir():
        return None
    return local if any((local / name).exists() for name in _HOME_CONTENTS) else None


def conductor_home() -> Path:
    """``$CONDUCTOR_HOME`` (``~`` expanded), else a legacy ``./.conductor``, else
    ``~/.conductor``; always absolute."""
    explicit = os.environ.get("CONDUCTOR_HOME")
    if explicit:
        return Path(explicit).expanduser().absolute()
    return _legacy_home() or default_home()


def legacy_home_notice() -> str | None:
    """One line for the terminal the first time a legacy ``./.conductor`` is used, else
    ``None``. Remembered in the legacy home itself, so it is said once per home."""
    if os.environ.get("CONDUCTOR_HOME"):
        return None
    legacy = _legacy_home()
    if legacy is None or (legacy / _NOTICE_MARKER).exists():
        return None
    try:
        (legacy / _NOTICE_MARKER).write_text("the notice of a project-local home was shown\n")
    except OSError:
        pass  # a read-only home: the notice shows again next time, nothing else changes
    return (
        f"conductor: using the project-local home {legacy} (the default before 0.2); "
        f"the default is now {default_home()}. Set CONDUCTOR_HOME to choose one."
    )


def model_cache_dir() -> Path:
    """Converted model weights: ``$CONDUCTOR_CACHE/models``, else
    ``${XDG_CACHE_HOME:-~/.cache}/conductor/models``."""
    explicit = os.environ.get("CONDUCTOR_CACHE")
    if explicit:
        root = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "conductor"
    return root.absolute() / "models"


def models_dir() -> Path:
    """Models downloaded from this home's MLflow registry (they belong to its store)."""
    return conductor_home() / "models"


def artifacts_location() -> str:
    """The Parquet dataset root: a local path or any URL pyarrow can write (``s3://…``).

    ``CONDUCTOR_ARTIFACTS`` overrides the default ``$CONDUCTOR_HOME/artifacts``.
    """
    explicit = os.environ.get("CONDUCTOR_ARTIFACTS")
    if explicit:
        return explicit
    return str(conductor_home() / "artifacts")


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
