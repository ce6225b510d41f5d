"""The model registry (issue #39: registry I/O lives in tasks/, not in the core).

``models:/NAME@ALIAS`` and ``models:/NAME/VERSION`` references, for trained conductors and
OrchRM alike, are downloaded from MLflow once into ``$CONDUCTOR_CACHE/models/registry`` and
reused; ``resolve_conductor`` and ``with_conductor`` are the core's, with this downloader.
"""

from __future__ import annotations

import re
from pathlib import Path

from prefect_conductor.conductor import adapters
from prefect_conductor.conductor.adapters import (
    AdapterError,
    AdapterInfo,
    NotRegistered,
    is_adapter_dir,
)
from prefect_conductor.conductor.home import mlflow_tracking_uri, models_dir
from prefect_conductor.conductor.pool import Pool

__all__ = ["download_registered", "resolve_conductor", "with_conductor"]


def download_registered(uri: str) -> Path:
    """Download a registered model's artifacts once; later calls reuse the copy."""
    import mlflow  # heavy, and only needed for registry references
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(mlflow_tracking_uri())
    client = mlflow.MlflowClient()
    m = re.fullmatch(r"models:/([^/@]+)(?:@([^/]+)|/(\d+))", uri)
    if m is None:
        raise AdapterError(f"{uri}: expected models:/NAME@ALIAS or models:/NAME/VERSION")
    name, alias, number = m.groups()
    try:
        version = (
            client.get_model_version_by_alias(name, alias)
            if alias
            else client.get_model_version(name, number)
        )
    except MlflowException as exc:
        # A missing model or alias is "not registered"; anything else (a tracking server
        # that is down) is not, so that ``champion`` never falls back on an outage.
        missing = exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
        error = NotRegistered if missing else AdapterError
        raise error(f"{uri}: not in the MLflow registry ({exc.message})") from None
    target = models_dir() / "registry" / name / str(version.version)
    if not is_adapter_dir(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source))
        found = (
            local
            if is_adapter_dir(local)
            else next((d.parent for d in local.rglob("adapter_config.json")), None)
        )
        if found is None:
            raise AdapterError(f"{uri}: version {version.version} holds no LoRA adapter")
        if found != target:
            import shutil

            shutil.copytree(found, target, dirs_exist_ok=True)
    return target


def resolve_conductor(ref: str) -> AdapterInfo:
    """:func:`prefect_conductor.conductor.adapters.resolve_conductor`, registry included."""
    return adapters.resolve_conductor(ref, download_registered)


def with_conductor(pool: Pool, ref: str) -> Pool:
    """:func:`prefect_conductor.conductor.adapters.with_conductor`, registry included."""
    return adapters.with_conductor(pool, ref, download_registered)
