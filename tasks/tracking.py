"""MLflow tracking of evaluations: one MLflow run per eval, in the embedded sqlite store or
on a tracking server that many hosts share.

The tracking URI is ``MLFLOW_TRACKING_URI`` when set (``http://host:5000`` for ``mlflow
server``, as ``deployments/stack.py`` runs it), else ``sqlite:///$CONDUCTOR_HOME/mlflow.db``
(MLflow 3's ``./mlruns`` file store is not supported). Every strategy evaluated
on one dataset lands in one experiment, ``eval/<dataset>``, so the strategies compare side by
side in the MLflow UI. Only pool *paths* and names are logged, never pool contents or keys.

Artifacts: with a local store (sqlite, any database, a file path) MLflow's default artifact
root is ``./mlruns`` relative to the *current directory*, so an experiment created here gets
``$CONDUCTOR_HOME/mlartifacts/<experiment>`` instead (issue #10); with a tracking server the
server's own artifact store decides. Every experiment of the product is created by
``mlflow_experiment``.

With a shared server, two hosts may create the same experiment or registered model at the
same moment: the one that loses the race uses the winner's (``RESOURCE_ALREADY_EXISTS``).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlparse

from prefect import task
from prefect.cache_policies import NO_CACHE

from conductor.home import mlflow_artifacts_dir, mlflow_tracking_uri

__all__ = [
    "experiment_artifact_location",
    "log_eval",
    "mlflow_experiment",
    "register_version",
    "tracking_uri",
]

# Tracking URIs whose server chooses where artifacts go (``mlflow server``, Databricks).
_SERVER_SCHEMES = frozenset({"http", "https", "databricks"})
_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"


def tracking_uri() -> str:
    return mlflow_tracking_uri()


def experiment_artifact_location(name: str, uri: str | None = None) -> str | None:
    """Artifact location of a new experiment ``name`` tracked at ``uri`` (default: ours).

    ``None`` for a tracking server, which stores artifacts where it is configured to.

    >>> experiment_artifact_location("eval/x", "http://localhost:5000") is None
    True
    """
    if urlparse(uri or tracking_uri()).scheme in _SERVER_SCHEMES:
        return None
    return (mlflow_artifacts_dir() / name).as_uri()


def mlflow_experiment(mlflow: Any, name: str) -> str:
    """The id of experiment ``name``, created with its artifacts under the home if missing.

    ``mlflow`` is the ``mlflow`` module (after ``set_tracking_uri``) or an ``MlflowClient``.
    """
    from mlflow.exceptions import MlflowException

    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=experiment_artifact_location(name))
    except MlflowException as exc:
        if exc.error_code != _ALREADY_EXISTS:
            raise
    return mlflow.get_experiment_by_name(name).experiment_id  # another host created it


def _ms(epoch_s: float | None) -> int:
    return int(1000 * (time.time() if epoch_s is None else epoch_s))


@task(
    cache_policy=NO_CACHE,
    name="log-eval",
    task_run_name="log eval to MLflow",
    retries=2,
    retry_delay_seconds=1,
)
def log_eval(
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    rows: list[dict[str, Any]],
    tags: dict[str, str],
    started_at: float | None = None,
    ended_at: float | None = None,
) -> str:
    """Log one evaluation; returns the MLflow run id.

    The run spans ``started_at`` to ``ended_at`` (epoch seconds; each defaults to now), so
    the MLflow UI shows the eval's real duration, not the time it took to log the results.
    """
    import mlflow  # heavy import, only when an eval is logged
    from mlflow.entities import Metric, Param, RunStatus

    client = mlflow.MlflowClient(tracking_uri())
    run = client.create_run(
        mlflow_experiment(client, experiment),
        start_time=_ms(started_at),
        tags=tags,
        run_name=run_name,
    )
    run_id = run.info.run_id
    try:
        logged_at = _ms(ended_at)
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, float(v), logged_at, 0) for k, v in metrics.items() if v is not None
            ],
            params=[Param(k, "" if v is None else str(v)) for k, v in params.items()],
        )
        if rows:
            client.log_table(
                run_id,
                data={k: [r.get(k) for r in rows] for k in rows[0]},
                artifact_file="results.json",
            )
    except Exception:
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED), end_time=_ms(ended_at))
    return run_id


def register_version(
    client: Any, run_id: str, directory: Any, name: str, artifact_path: str, tags: dict[str, str]
) -> Any:
    """Log ``directory`` under the run and register it as a new version of model ``name``
    (created if missing), alias ``candidate``. Returns the model version."""
    from mlflow.exceptions import MlflowException

    client.log_artifacts(run_id, str(directory), artifact_path=artifact_path)
    run = client.get_run(run_id)
    try:
        client.get_registered_model(name)
    except MlflowException:
        try:
            client.create_registered_model(name)
        except MlflowException as exc:  # another host registered it meanwhile
            if exc.error_code != _ALREADY_EXISTS:
                raise
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run_id, tags=tags
    )
    client.set_registered_model_alias(name, "candidate", version.version)
    return version
