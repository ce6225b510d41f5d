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

A tracking server briefly down (issue #19, item 3): every write helper here first waits for
the server to answer (``GET /health``, with backoff from 0.2 s doubling to 5 s, for
``CONDUCTOR_MLFLOW_RETRY_S`` seconds, default 15, as the artifact store does with
``CONDUCTOR_ARTIFACTS_RETRY_S``), then writes through MLflow's own client. That client
retries a request once the server has answered (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default
7, exponential backoff: about 4 minutes), but on a refused connection it would spend those
same 4 minutes and then raise a screenful; waiting here first bounds the common case (the
server is restarting) by our setting and leaves MLflow's retries for the rare outage in the
middle of a write. Either way the failure is one :class:`TrackingUnavailableError` line
naming the server.
"""

from __future__ import annotations

import os
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect_conductor.conductor.errors import (
    StoreUnavailableError,
    TrackingError,
    TrackingUnavailableError,
)
from prefect_conductor.conductor.home import mlflow_artifacts_dir, mlflow_tracking_uri

__all__ = [
    "TrackingError",
    "TrackingUnavailableError",
    "experiment_artifact_location",
    "finish_run",
    "log_eval",
    "mlflow_experiment",
    "model_version_by_alias",
    "open_run",
    "register_version",
    "retry_unless_unreachable",
    "tracking_retry_s",
    "tracking_server",
    "tracking_uri",
    "wait_for_tracking_server",
]

# Tracking URIs whose server chooses where artifacts go (``mlflow server``, Databricks).
_SERVER_SCHEMES = frozenset({"http", "https", "databricks"})
_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
_RETRY_S = 15.0  # default budget of retries while the tracking server is unreachable
_PROBE_TIMEOUT_S = 3.0  # one GET /health; a server that accepts but never answers is down
_DOWN_STATUS = frozenset({502, 503, 504})  # a proxy in front of a server that is not up


def tracking_uri() -> str:
    return mlflow_tracking_uri()


def tracking_retry_s() -> float:
    """``CONDUCTOR_MLFLOW_RETRY_S`` (seconds, default 15): how long a write waits for an
    unreachable tracking server."""
    raw = os.environ.get("CONDUCTOR_MLFLOW_RETRY_S", "").strip()
    try:
        return max(0.0, float(raw)) if raw else _RETRY_S
    except ValueError:
        raise TrackingError(
            f"CONDUCTOR_MLFLOW_RETRY_S must be a number of seconds, got {raw!r}"
        ) from None


def _server(uri: str) -> str | None:
    """``uri`` when it is an http(s) tracking server, else None (sqlite, a database, files)."""
    return uri.rstrip("/") if urlparse(uri).scheme in ("http", "https") else None


def _shown(url: str) -> str:
    """``url`` without a user or password, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _why_down(url: str, timeout: float) -> str | None:
    """None when the server at ``url`` answers at all (any HTTP status but a proxy's 502-504,
    a TLS handshake MLflow's own settings may accept); else why not, on one line."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout):  # noqa: S310 - http(s) only
            return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.reason}" if e.code in _DOWN_STATUS else None
    except urllib.error.URLError as e:
        cause = e.reason
        if isinstance(cause, ssl.SSLError):
            return None  # it answered; certificates are MLflow's business
        return _reason(cause)
    except OSError as e:  # a timeout, a reset connection
        return _reason(e)


def _reason(e: BaseException | str) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split())
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    return (found[1].strip() if found else text or type(e).__name__)[:300]


def wait_for_tracking_server(
    what: str, uri: str | None = None, retry_s: float | None = None
) -> None:
    """Return once the tracking server at ``uri`` (default: ours) answers; at once for a
    local store. Retries with backoff for ``retry_s`` (default :func:`tracking_retry_s`),
    then raises one :class:`TrackingUnavailableError` line naming the server and ``what``.
    """
    url = _server(uri or tracking_uri())
    if url is None:
        return
    budget = tracking_retry_s() if retry_s is None else max(0.0, retry_s)
    deadline, delay = time.monotonic() + budget, 0.2
    while True:
        remaining = deadline - time.monotonic()
        why = _why_down(url, max(0.2, min(_PROBE_TIMEOUT_S, remaining)))
        if why is None:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TrackingUnavailableError(
                f"MLflow tracking server {_shown(url)} unreachable ({what}; retried "
                f"{budget:g} s): {why} (CONDUCTOR_MLFLOW_RETRY_S sets how long to wait)"
            )
        time.sleep(min(delay, remaining))  # the last try is at the deadline
        delay = min(delay * 2, 5.0)


def _unreachable(e: BaseException) -> bool:
    """An error of MLflow's client that means the server did not answer (after MLflow's own
    retries: it raises an ``MlflowException`` in the ``except`` of a ``requests`` error), as
    opposed to a request the server refused."""
    from requests import exceptions as http

    lost = (http.ConnectionError, http.RetryError, http.Timeout)
    return isinstance(e, lost) or isinstance(e.__cause__ or e.__context__, lost)


@contextmanager
def tracking_server(what: str, uri: str | None = None) -> Iterator[None]:
    """Writes to MLflow: waits for the server first (:func:`wait_for_tracking_server`), and
    turns a server lost during the writes into one :class:`TrackingUnavailableError` line.

    >>> with tracking_server("log nothing", "sqlite:///x.db"):  # a local store: no wait
    ...     pass
    """
    uri = uri or tracking_uri()
    wait_for_tracking_server(what, uri)
    try:
        yield
    except Exception as e:
        if _server(uri) is None or not _unreachable(e):
            raise
        raise TrackingUnavailableError(
            f"MLflow tracking server {_shown(_server(uri) or uri)} unreachable ({what}; lost "
            f"during the write, after MLflow's own retries): {_reason(e)} "
            "(MLFLOW_HTTP_REQUEST_MAX_RETRIES sets how many)"
        ) from e


def retry_unless_unreachable(task: Any, task_run: Any, state: Any) -> bool:
    """A Prefect ``retry_condition_fn``: retry a failed write, except when its server stayed
    unreachable: the write already waited for it (``CONDUCTOR_MLFLOW_RETRY_S`` for MLflow,
    ``CONDUCTOR_ARTIFACTS_RETRY_S`` for the artifact store), and each retry would wait again."""
    try:
        state.result()
    except (TrackingUnavailableError, StoreUnavailableError):
        return False
    except Exception:  # noqa: BLE001 - e.g. sqlite's "database is locked": worth a retry
        return True
    return False


def _uri_of(mlflow: Any) -> str:
    """The tracking URI of the ``mlflow`` module or of an ``MlflowClient``."""
    uri = getattr(mlflow, "tracking_uri", None)
    if isinstance(uri, str):
        return uri
    return mlflow.get_tracking_uri() if hasattr(mlflow, "get_tracking_uri") else tracking_uri()


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
    A tracking server that is down is waited for (:func:`tracking_server`).
    """
    from mlflow.exceptions import MlflowException

    with tracking_server(f"open experiment {name}", _uri_of(mlflow)):
        found = mlflow.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            location = experiment_artifact_location(name)
            return mlflow.create_experiment(name, artifact_location=location)
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
    retry_condition_fn=retry_unless_unreachable,
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

    uri = tracking_uri()
    client = mlflow.MlflowClient(uri)
    with tracking_server(f"log eval {run_name!r} to experiment {experiment}", uri):
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
        except Exception as exc:
            if not _unreachable(exc):  # a server that is gone would keep us minutes more
                client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
            raise
        client.set_terminated(
            run_id, RunStatus.to_string(RunStatus.FINISHED), end_time=_ms(ended_at)
        )
    return run_id


def open_run(experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
    """A new run ``run_name`` in ``experiment`` (created if missing) with ``params`` (None is
    logged as an empty string) and ``tags``; returns its id. The training runs of the
    conductor and of OrchRM open this way, and end with :func:`finish_run`."""
    import mlflow
    from mlflow.entities import Param

    uri = tracking_uri()
    client = mlflow.MlflowClient(uri)
    with tracking_server(f"open run {run_name} in experiment {experiment}", uri):
        run = client.create_run(mlflow_experiment(client, experiment), run_name=run_name, tags=tags)
        client.log_batch(
            run.info.run_id,
            params=[Param(k, "" if v is None else str(v)) for k, v in params.items()],
        )
    return run.info.run_id


def finish_run(run_id: str, status: str, metrics: dict[str, float | None] | None = None) -> None:
    """Log ``metrics`` (the None ones skipped) into run ``run_id``, then end it as
    ``status`` (``FINISHED``, ``FAILED``)."""
    import mlflow
    from mlflow.entities import Metric

    uri = tracking_uri()
    client = mlflow.MlflowClient(uri)
    stamp = _ms(None)
    known = [Metric(k, float(v), stamp, 0) for k, v in (metrics or {}).items() if v is not None]
    with tracking_server(f"finish run {run_id} ({status})", uri):
        if known:
            client.log_batch(run_id, metrics=known)
        client.set_terminated(run_id, status=status)


def model_version_by_alias(client: Any, name: str, alias: str) -> Any | None:
    """The version of registered model ``name`` that ``alias`` points at, None if there is
    none. A tracking server that is down is waited for, then is one
    :class:`TrackingUnavailableError` line: never read as "no such alias"."""
    from mlflow.exceptions import MlflowException

    with tracking_server(f"read model {name}@{alias}", _uri_of(client)):
        try:
            return client.get_model_version_by_alias(name, alias)
        except MlflowException as missing:
            if _unreachable(missing):
                raise
            return None


def register_version(
    client: Any, run_id: str, directory: Any, name: str, artifact_path: str, tags: dict[str, str]
) -> Any:
    """Log ``directory`` under the run and register it as a new version of model ``name``
    (created if missing), alias ``candidate``. Returns the model version."""
    from mlflow.exceptions import MlflowException

    with tracking_server(f"register a version of model {name}", _uri_of(client)):
        client.log_artifacts(run_id, str(directory), artifact_path=artifact_path)
        run = client.get_run(run_id)
        try:
            client.get_registered_model(name)
        except MlflowException as missing:
            if _unreachable(missing):
                raise
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
