"""``conductor eval --fan-out``: an eval's questions answered by the fleet (issue #19); also
every plan of ``conductor train-conductor --fan-out`` (``flows/train_conductor.py``).

Each question is a **background task run** (what ``Task.delay`` makes) of ``fleet_question``
(``tasks/fleet.py``), a task that every ``conductor serve`` serves
(``prefect.task_worker.serve``): the Prefect server hands it to one subscribed serve process,
on any host. Nothing here schedules or queues: Prefect's server keeps the queue and picks the
worker. This module is the eval's side: it sends the questions and reads their outcomes. The
eval keeps what it does in-process (``flows/evaluate.py``): at most ``concurrency`` questions
in flight, the same progress artifact, the same ``RunBatch`` of rows, summary, ``EvalResult``
and MLflow run; only where a question runs changes.

- **Parameters and results on shared storage.** The request goes to the task-scheduling
  storage (``PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK``) and the question's outcome
  (its ``RunResult`` and its unstored ``runs``/``steps`` rows) comes back through the result
  storage (``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK``): storage every host reads, e.g. the
  prefect-aws ``S3Bucket`` block that ``deployments/stack.py up`` creates. The eval host
  stores the rows in the shared artifact store, once per run id.
- **The eval's flow run, remotely.** A send carries the eval's flow run context (Prefect's
  ``serialize_context``, made once per eval, as ``.delay()`` would for each send, less the
  eval host's settings: a worker keeps its own), and the worker runs the question inside it:
  the question's step task runs belong to the eval's flow run, as in-process, and its log
  lines go to the eval.
- **Idempotent run ids.** A question's run id is derived from the question id and the
  request's tags (the eval id and sample; a rollout's training run, step and index:
  ``fleet_run_id``), not from the task run: the same question sent twice is the same run,
  and ``RunBatch`` stores it once.
- **A worker that dies.** Prefect redelivers a run a worker received but did not
  acknowledge; one that the worker had acknowledged stays Running (or Scheduled) for ever.
  The eval watches (``CHECK_S``) the server's list of subscribed task workers and the
  names of its in-flight task runs (``question <id> on <host>-<pid>``, the worker's Prefect
  client id, set when the worker starts the run). A worker absent from two checks in a row
  is dead: each in-flight question not running on a live worker is sent again (the old task
  run is marked Crashed), at most ``MAX_TRIES`` times, and then ends as one failure naming
  the worker. The first outcome of a question wins; a late one of a resent question is
  ignored. With no serve process subscribed for ``NO_WORKER_S``, the questions in flight end
  as failures saying so.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect import get_client, get_run_logger
from prefect.context import FlowRunContext, serialize_context
from prefect.results import get_or_create_default_task_scheduling_storage
from prefect.utilities.asyncutils import run_coro_as_sync

from prefect_conductor.conductor.errors import ConductorError
from prefect_conductor.conductor.plan.requests import OrchestrateRequest
from prefect_conductor.tasks.fleet import fleet_question, worker_id, worker_of

__all__ = [
    "FanOutError",
    "Fleet",
    "FleetFuture",
    "absolute",
    "check_fleet",
    "fleet_run_id",
    "worker_id",
]

CHECK_S = 3.0  # how often the eval reads the live task workers and its in-flight task runs
SETTLE_THREADS = 4  # outcomes read from the result storage at once
MAX_TRIES = 3  # sends of one question whose worker died, before it ends as a failure
NO_WORKER_S = 60.0  # no serve process subscribed this long: the questions in flight fail
_RUN_IDS = uuid.UUID("6f1c1d0e-4c1a-4c8e-9f5e-19c0a0c0d019")  # uuid5 namespace of run ids
_log = logging.getLogger("prefect_conductor.fanout")


class FanOutError(ConductorError):
    """``--fan-out`` cannot run: no Prefect server, or no storage every host reads."""


def fleet_run_id(request: OrchestrateRequest) -> str:
    """The run id of a request sent to the fleet: the same for every send of the same
    request (its question and its tags: an eval's id and sample, a GRPO rollout's run, step
    and index), different for any two requests that differ in either."""
    key = json.dumps([request.question_id, sorted(request.tags.items())])
    return str(uuid.uuid5(_RUN_IDS, key))


def check_fleet() -> None:
    """Fail in one line unless every host can reach the parameters and results."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if not settings.api.url:
        raise FanOutError(
            "--fan-out needs a running Prefect server that the serve processes use "
            "(PREFECT_API_URL); the temporary server of one command has no task workers"
        )
    missing = [
        name
        for name, value in (
            ("PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK", settings.tasks.scheduling),
            ("PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK", settings.results),
        )
        if not value.default_storage_block
    ]
    if missing:
        raise FanOutError(
            f"--fan-out needs storage every host reads for the questions and their results: "
            f"set {' and '.join(missing)} (e.g. s3-bucket/conductor-results; "
            "deployments/stack.py up creates that block and its env files set both)"
        )


def worker_storage_gap() -> str | None:
    """What a serve process lacks to answer fan-out questions, if anything: it reads their
    parameters from the task-scheduling storage and writes their outcomes to the result
    storage with its own settings (the eval's are not sent), so with only the first set the
    outcomes would stay on this host and the eval would wait for them in vain."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.tasks.scheduling.default_storage_block and not (
        settings.results.default_storage_block
    ):
        return (
            "PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK is set but "
            "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK is not: the outcomes of fan-out questions "
            "this process answers would stay on this host; set it to the same block"
        )
    return None


# --- the eval's side ---------------------------------------------------------------------


class FleetFuture:
    """One question on the fleet, across its sends; the same calls as the in-process future
    that ``flows/evaluate.py`` uses (``add_done_callback``, ``result``)."""

    def __init__(self, request: OrchestrateRequest, run_id: str):
        self.request = request
        self.run_id = run_id
        self.tries = 0
        self.task_run_id: uuid.UUID | None = None
        self.sent_at = 0.0
        self._outcome: Any = None
        self._done = threading.Event()
        self._callbacks: list[Callable[[FleetFuture], None]] = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, fn: Callable[[FleetFuture], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def result(self, timeout: float | None = None, raise_on_failure: bool = False) -> Any:
        """The outcome: a ``RunOutcome`` or ``RunResult``, or the exception it ended with."""
        self._done.wait(timeout)
        if raise_on_failure and isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome

    def finish(self, outcome: Any) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            self._outcome = outcome
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)
        return True


class Fleet:
    """The eval's view of the fleet: sends questions, reads their outcomes, resends the
    questions of a worker that died. Create it in the eval's flow run (its context is what
    the workers run the questions in)."""

    def __init__(self, concurrency: int = 4):
        from prefect.task_runs import TaskRunWaiter

        check_fleet()
        TaskRunWaiter.instance()  # subscribed to task-run events before the first send
        try:
            self._run_log: Any = get_run_logger()
        except Exception:  # noqa: BLE001 - outside a run: the terminal only
            self._run_log = None
        self._pending: dict[uuid.UUID, FleetFuture] = {}  # by the current send's task run
        self._ended: queue.SimpleQueue[uuid.UUID] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._live: set[str] = set()
        self._missing: dict[str, int] = {}  # worker -> consecutive checks it was absent
        self._no_worker_since: float | None = None
        self._told_waiting = False
        self.concurrency = concurrency
        self.resent = 0
        self._settling = ThreadPoolExecutor(SETTLE_THREADS, thread_name_prefix="fleet-result")
        # What every send shares, read once: the eval's flow run (serialized as Prefect's
        # ``.delay()`` does, for the worker to run the question in) and the task-scheduling
        # storage block. ``.delay()`` reads both again for each send (0.23 s of its 0.46 s
        # here) and makes a new API client; the calls themselves are those ``.delay()`` makes.
        self._sent_context = serialize_context()
        # Not the eval host's settings: the worker runs with its own (its API URL, storage
        # blocks, home), and validating a whole Settings per question was a sixth of a serve's
        # CPU per question (31.6 ms of 0.19 s, issue #19).
        self._sent_context.pop("settings_context", None)
        flow_run = getattr(FlowRunContext.get(), "flow_run", None)
        self._flow_run_id = flow_run.id if flow_run is not None else None
        self._storage = run_coro_as_sync(get_or_create_default_task_scheduling_storage())
        # One API client for every send (making one is most of a send's own time); closed
        # with the fleet.
        self._client = get_client(sync_client=True).__enter__()
        weakref.finalize(self, self._client.__exit__, None, None, None)

    def _warn(self, message: str) -> None:
        """A fleet fault, on the terminal (``conductor: …``: the CLI hides the runs' own log
        lines) and in the eval's flow run log (the UI)."""
        _log.warning(message)
        if self._run_log is not None:
            self._run_log.warning(message)

    # the call that flows/evaluate.py makes in place of eval_question.submit
    def submit(self, request: OrchestrateRequest) -> FleetFuture:
        request = request.model_copy(
            update={"pool": absolute(request.pool), "conductor": absolute(request.conductor)}
        )
        future = FleetFuture(request, fleet_run_id(request))
        self._send(future)
        return future

    def _send(self, future: FleetFuture) -> None:
        from prefect.task_runs import TaskRunWaiter

        future.tries += 1
        task_run_id = self._defer(future)
        future.task_run_id, future.sent_at = task_run_id, time.monotonic()
        with self._lock:
            self._pending[task_run_id] = future
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="fleet", daemon=True)
                self._thread.start()
        TaskRunWaiter.add_done_callback(task_run_id, lambda: self._ended.put(task_run_id))

    def _defer(self, future: FleetFuture) -> uuid.UUID:
        """``fleet_question.delay(request, run_id)``, with what every send shares made once:
        the parameters (and the eval's context) on the task-scheduling storage, then a
        deferred Scheduled task run of ``fleet_question`` in the eval's flow run, which the
        Prefect server hands to one subscribed ``conductor serve``."""
        from prefect.results import ResultStore
        from prefect.states import Scheduled
        from prefect.task_worker import store_parameters
        from prefect.utilities.engine import emit_task_run_state_change_event

        parameters_id = uuid.uuid4()
        state = Scheduled()
        state.state_details.deferred = True
        state.state_details.task_parameters_id = parameters_id
        parameters = {"request": future.request, "run_id": future.run_id}
        data = {"context": self._sent_context, "parameters": parameters}

        async def store() -> None:
            results = ResultStore(result_storage=self._storage)
            await store_parameters(
                await results.aupdate_for_task(fleet_question), parameters_id, data
            )

        run_coro_as_sync(store())
        task_run = self._client.create_task_run(
            task=fleet_question,
            flow_run_id=self._flow_run_id,
            dynamic_key=f"{future.run_id}-{future.tries}",  # unique per send in the flow run
            name=f"question {future.request.question_id} (sent {future.tries})",
            state=state,
            task_inputs={"request": [], "run_id": []},
        )
        emit_task_run_state_change_event(
            task_run=task_run, initial_state=None, validated_state=task_run.state
        )
        return task_run.id

    # --- the watcher thread: outcomes and faults ---

    def _watch(self) -> None:
        checked = time.monotonic()
        while True:
            try:
                ended = [self._ended.get(timeout=1.0)]
                while not self._ended.empty():
                    ended.append(self._ended.get_nowait())
            except queue.Empty:
                ended = []
            for task_run_id in ended:  # reading a result is a GET: several at once
                self._settling.submit(self._settle, task_run_id, None)
            if time.monotonic() - checked >= CHECK_S:
                checked = time.monotonic()
                try:
                    self._check()
                except Exception as exc:  # noqa: BLE001 - the API hiccuped: look again later
                    self._warn(f"fan-out: could not check the fleet: {exc}")
            with self._lock:
                if not self._pending and self._ended.empty():
                    self._thread = None
                    return

    def _take(self, task_run_id: uuid.UUID) -> FleetFuture | None:
        with self._lock:
            return self._pending.pop(task_run_id, None)

    def _settle(self, task_run_id: uuid.UUID, state: Any) -> None:
        """A send ended (its terminal event, or its state read in a check)."""
        from prefect.task_runs import TaskRunWaiter

        future = self._take(task_run_id)
        if future is None:  # a superseded send, or one settled already
            return
        if state is None:
            state = run_coro_as_sync(TaskRunWaiter.wait_for_task_run(task_run_id, timeout=5))
        if state is None:  # no event after all: the next check reads the API
            with self._lock:
                self._pending[task_run_id] = future
            return
        if state.is_crashed():  # the worker's process went down under it
            self._resend(future, f"its worker crashed: {state.message or state.name}")
            return
        try:
            outcome = state.result(raise_on_failure=False)
        except Exception as exc:  # noqa: BLE001 - the stored result is unreadable
            outcome = exc
        if isinstance(outcome, BaseException):
            qid = future.request.question_id
            self._warn(f"fan-out: question {qid} failed on the fleet: {_line(outcome)}")
        future.finish(outcome)

    def _check(self) -> None:
        """Live workers and in-flight task runs from the API; resend a dead worker's questions."""
        from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

        with self._lock:
            in_flight = dict(self._pending)
        client = self._client
        answer = client._client.post(  # the API's list; the client has no method for it
            "/task_workers/filter",
            json={"task_worker_filter": {"task_keys": [fleet_question.task_key]}},
        )
        answer.raise_for_status()
        live = {w["identifier"] for w in answer.json()}
        runs = {}
        ids = list(in_flight)
        for start in range(0, len(ids), 200):
            flt = TaskRunFilter(id=TaskRunFilterId(any_=ids[start : start + 200]))
            runs.update({r.id: r for r in client.read_task_runs(task_run_filter=flt)})
        now = time.monotonic()
        owners = {_owner(run) for run in runs.values()} - {None}
        # A worker that owns an in-flight run counts even if no check saw it alive (it took
        # the run and died between two checks).
        for worker in self._live | set(self._missing) | owners:
            self._missing[worker] = 0 if worker in live else self._missing.get(worker, 0) + 1
        # Absent from two checks in a row (the server forgets a worker for an instant
        # after each delivery): dead.
        dead = {w for w, n in self._missing.items() if n >= 2}
        for worker in dead:
            del self._missing[worker]
        self._live = live
        if live:
            self._no_worker_since, self._told_waiting = None, False
        elif self._no_worker_since is None:
            self._no_worker_since = now
        for task_run_id, future in in_flight.items():
            run = runs.get(task_run_id)
            if run is not None and run.state is not None and run.state.is_final():
                self._settle(task_run_id, run.state)  # its event was missed
                continue
            owner = _owner(run)
            if owner in live:
                continue
            if run is None:  # deleted by a worker that could not read its parameters
                if self._take(task_run_id) is not None:
                    future.finish(
                        FanOutError(
                            f"question {future.request.question_id}: a worker deleted its "
                            "task run, unable to read its parameters: do all hosts share "
                            "PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK?"
                        )
                    )
            elif dead and (owner in dead or owner is None):
                # A dead worker's question, or one it may have taken (acknowledged, not yet
                # started): sent again. A question still in the server's queue then runs
                # twice; its first outcome wins.
                if self._take(task_run_id) is not None:
                    _mark_crashed(task_run_id, f"conductor serve {owner or '?'} stopped")
                    self._resend(future, f"conductor serve {owner or '(unknown)'} stopped")
        if self._no_worker_since is not None:
            waited = now - self._no_worker_since
            if not self._told_waiting and in_flight:
                self._told_waiting = True
                self._warn(
                    "fan-out: no `conductor serve` is subscribed to this Prefect server; "
                    f"waiting up to {NO_WORKER_S:.0f} s for one"
                )
            if waited >= NO_WORKER_S:
                for task_run_id, future in in_flight.items():
                    if self._take(task_run_id) is not None:
                        _mark_crashed(task_run_id, "no conductor serve")
                        future.finish(
                            FanOutError(
                                f"question {future.request.question_id}: no `conductor serve` "
                                f"was subscribed for {waited:.0f} s"
                            )
                        )

    def _resend(self, future: FleetFuture, why: str) -> None:
        qid = future.request.question_id
        if future.tries >= MAX_TRIES:
            message = f"question {qid}: {why}; sent {future.tries} times, giving up"
            self._warn(f"fan-out: {message}")
            future.finish(FanOutError(message))
            return
        self.resent += 1
        self._warn(f"fan-out: question {qid}: {why}; sending it again")
        try:
            self._send(future)
        except Exception as exc:  # noqa: BLE001 - the API is down: this question fails
            future.finish(exc)


def _owner(run: Any) -> str | None:
    """The worker id in a sent question's task run name (set when a worker starts it)."""
    return worker_of(run.name) if run is not None else None


def _mark_crashed(task_run_id: uuid.UUID, message: str) -> None:
    """A send we gave up on shows as Crashed, not Running for ever (best effort)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
    except Exception:  # noqa: BLE001 - only the UI's view is at stake
        pass


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def absolute(value: str | None) -> str | None:
    """A path that exists here, made absolute (the same path on every host)."""
    if value and not value.startswith("models:/") and Path(value).expanduser().exists():
        return str(Path(value).expanduser().resolve())
    return value
