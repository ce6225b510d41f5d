"""MLflow tracking of evaluations: one MLflow run per eval, in the embedded sqlite store.

The tracking URI is ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///$CONDUCTOR_HOME/
mlflow.db`` (MLflow 3's ``./mlruns`` file store is not supported). Artifacts of the embedded
store go to ``$CONDUCTOR_HOME/mlartifacts``. Every strategy evaluated on one dataset lands in
one experiment, ``eval/<dataset>``, so the strategies compare side by side in the MLflow UI.
Only pool *paths* and names are logged, never pool contents or keys.
"""

from __future__ import annotations

import os
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from conductor.home import conductor_home, mlflow_tracking_uri

__all__ = ["tracking_uri", "log_eval", "mlflow_experiment", "register_version"]


def tracking_uri() -> str:
    return mlflow_tracking_uri()


def mlflow_experiment(mlflow: Any, name: str) -> str:
    """The id of experiment ``name``, created with artifacts under the home if missing."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        location = (conductor_home().absolute() / "mlartifacts").as_uri()
    return mlflow.create_experiment(name, artifact_location=location)


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
) -> str:
    """Log one evaluation; returns the MLflow run id."""
    import mlflow  # heavy import, only when an eval is logged

    mlflow.set_tracking_uri(tracking_uri())
    experiment_id = mlflow_experiment(mlflow, experiment)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        mlflow.log_params({k: ("" if v is None else v) for k, v in params.items()})
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None})
        if rows:
            mlflow.log_table(
                data={k: [r.get(k) for r in rows] for k in rows[0]}, artifact_file="results.json"
            )
        return run.info.run_id


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
        client.create_registered_model(name)
    version = client.create_model_version(
        name, source=f"{run.info.artifact_uri}/{artifact_path}", run_id=run_id, tags=tags
    )
    client.set_registered_model_alias(name, "candidate", version.version)
    return version
