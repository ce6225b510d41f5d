"""The ``conductor`` command as a user runs it: a subprocess, exit codes, stdout vs stderr.

Workers are litellm models answered by litellm's own ``mock_response``, so nothing leaves the
machine and no key is needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

PLAN = "model_id = [0, 0]\nsubtasks = ['think', 'answer']\naccess_list = [[], [0]]"
RUN_KEYS = {
    "run_id",
    "status",
    "answer",
    "workflow",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "wall_s",
    "artifacts",
}


def cli_env(cwd: Path, **extra: str) -> dict[str, str]:
    """A user's environment: homes under ``cwd``, no Prefect server configured."""
    env = {**os.environ, "CONDUCTOR_HOME": str(cwd / "home"), "PREFECT_HOME": str(cwd / "prefect")}
    env.pop("PREFECT_API_URL", None)  # the CLI uses its own ephemeral server here
    env.pop("MLFLOW_TRACKING_URI", None)  # set by mlflow.set_tracking_uri in earlier tests
    return env | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])} | extra


def conductor(
    *args: str,
    cwd: Path,
    stdin: str | None = None,
    timeout: int = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefect_conductor.cli.app", *args],
        cwd=cwd,
        env=env or cli_env(cwd),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_pool(tmp_path: Path, worker_response: str, conductor_response: str = PLAN) -> Path:
    pool = {
        "conductor": {
            "model": "openai/gpt-4o-mini",
            "params": {"mock_response": conductor_response},
        },
        "workers": [
            {
                "name": "gpt",
                "model": "openai/gpt-4o-mini",
                "retries": 0,
                "params": {"mock_response": worker_response},
            },
        ],
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


def assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr
    assert "CancelledError" not in stderr
    assert "database is locked" not in stderr
    # No third-party notices, and no progress bar into a pipe (issue #10).
    assert "Starting temporary server" not in stderr
    assert "Creating initial MLflow database tables" not in stderr
    assert "\r" not in stderr


def write_tool_pool(tmp_path: Path) -> Path:
    """A pool whose only worker is the calculator; its conductor is never asked."""
    pool = {
        "conductor": {"model": "openai/gpt-4o-mini", "params": {"mock_response": PLAN}},
        "workers": [{"name": "calculator", "kind": "tool", "model": "tool/calculator"}],
    }
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(pool))
    return path


def test_run_json_prints_one_object_and_no_noise(tmp_path):
    pool = write_pool(tmp_path, "42")
    proc = conductor("run", "What is 17 + 25?", "--pool", str(pool), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert proc.stdout.strip().count("\n") == 0
    assert RUN_KEYS <= set(data)
    assert data["status"] == "completed" and data["answer"] == "42"
    assert [s["instruction"] for s in data["workflow"]] == ["think", "answer"]
    assert data["cost_usd"] > 0  # priced from litellm's map for gpt-4o-mini
    assert Path(data["artifacts"]).is_dir()
    # Progress goes to stderr: the plan, one line per step as it finishes (issue #16).
    assert "plan:\n  step 0 · gpt reads [-]: think" in proc.stderr
    assert "  ✓ step 0 · gpt" in proc.stderr and "  ✓ step 1 · gpt" in proc.stderr
    assert "Task run" not in proc.stderr and "Flow run" not in proc.stderr  # Prefect's lines
    assert_clean(proc.stderr)
    # Every task run reached the database as final before the ephemeral server stopped.
    import sqlite3

    db = sqlite3.connect(tmp_path / "home" / "prefect" / "prefect.db")  # the one home (#39)
    states = db.execute("select name, state_type from task_run").fetchall()
    assert len(states) >= 4  # plan, two steps, save
    assert {t for _, t in states} == {"COMPLETED"}, states
    summary = conductor("artifacts", "--json", cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    s = json.loads(summary.stdout)
    assert s["runs"] == 1 and s["steps"] == 2 and s["failed_steps"] == 0
    assert s["input_tokens"] == data["input_tokens"]
    assert not (tmp_path / "mlruns").exists()
    # The temporary server's own output went to its log, not to this terminal.
    log = (tmp_path / "home" / "logs" / "prefect-server.log").read_text()
    assert log.startswith("--- ") and " pid " in log.splitlines()[0]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc")
def test_temporary_server_writes_to_its_log_not_to_the_terminal(tmp_path):
    """Its shutdown tracebacks (CI saw one) cannot reach the command's stderr or stdout."""
    script = (
        "import os\n"
        "import prefect_conductor.runtime.server\n"
        "from prefect_conductor.runtime.server import start_temporary_server\n"
        "from prefect.server.api.server import SubprocessASGIServer\n"
        "prefect_conductor.runtime.server.NEW_DATABASE_NOTICE_S = 0.0  # said at once\n"
        "prefect_conductor.runtime.server.SLOW_START_NOTICE_S = float(os.environ['SLOW_NOTICE'])\n"
        "start_temporary_server()\n"
        "pid = SubprocessASGIServer().server_process.pid\n"
        "print(os.readlink(f'/proc/{pid}/fd/1'), os.readlink(f'/proc/{pid}/fd/2'))\n"
        "print(os.readlink('/proc/self/fd/2'))\n"
    )

    def start(slow_notice: float) -> subprocess.CompletedProcess[str]:
        env = {**cli_env(tmp_path), "SLOW_NOTICE": str(slow_notice)}
        env.pop("PREFECT_SERVER_DATABASE_CONNECTION_URL", None)
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    proc = start(slow_notice=1e6)
    assert proc.returncode == 0, proc.stderr
    first, ours = proc.stdout.splitlines()
    server_out, server_err = first.split()
    log = str(tmp_path / "home" / "logs" / "prefect-server.log")
    assert server_out == log and server_err == log
    assert ours != log  # this process's stderr was given back
    # A slow start is said once on the terminal, with the generous wait (issue #17), and its
    # database lives under the one home (issue #39).
    assert proc.stderr.count("temporary server is still starting") == 1, proc.stderr
    assert "waiting up to 300 s" in proc.stderr and "first start" in proc.stderr
    assert "still starting" not in Path(log).read_text()
    assert (tmp_path / "home" / "prefect" / "prefect.db").is_file()
    # Its database exists now: no word unless the wait is long (issue #39: it came every time).
    again = start(slow_notice=1e6)
    assert again.returncode == 0 and "still starting" not in again.stderr, again.stderr


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_eval_leaves_no_temporary_server_behind(tmp_path, sig):
    """Issue #17 measured the server living on with PPID 1 after `conductor eval` died."""
    cli = subprocess.Popen(
        [sys.executable, "-m", "prefect_conductor.cli.app", "eval", "--dataset", "arithmetic",
         "--strategy", "single:calculator", "--limit", "200"],
        cwd=tmp_path, env=cli_env(tmp_path),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        server = None
        while server is None and time.monotonic() < deadline and cli.poll() is None:
            server = next((p for p, cmd in _children(cli.pid) if "uvicorn" in cmd), None)
            time.sleep(0.2)
        assert server is not None, "the eval started no temporary server"
        time.sleep(1.0)  # the eval is under way
        cli.send_signal(sig)
        cli.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(server), f"temporary server {server} outlived the eval ({sig.name})"
    finally:
        if cli.poll() is None:
            cli.kill()


def test_temporary_server_that_does_not_start_is_one_line(tmp_path):
    pool = write_pool(tmp_path, "42")
    # A startup timeout of 0: Prefect gives up at once.
    env = cli_env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="0")
    proc = conductor("run", "Hi?", "--pool", str(pool), cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "temporary server did not start" in errors[0]
    assert str(tmp_path / "home" / "logs" / "prefect-server.log") in errors[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_eval_leaves_the_terminal_and_the_cwd_clean(tmp_path):
    """An eval: one JSON object on stdout; on stderr no MLflow or Prefect notice and no
    carriage-return progress lines (stderr is a pipe); MLflow artifacts under the home."""
    pool = write_tool_pool(tmp_path)
    proc = conductor(
        "eval",
        "--dataset",
        "arithmetic",
        "--limit",
        "2",
        "--strategy",
        "single:calculator",
        "--pool",
        str(pool),
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["n"] == 2 and result["strategy"] == "single:calculator"
    assert_clean(proc.stderr)
    assert not (tmp_path / "mlruns").exists()
    artifacts = tmp_path / "home" / "mlartifacts" / "eval" / "arithmetic"
    assert list(artifacts.glob(f"{result['mlflow_run_id']}/artifacts/results.json"))


def test_failing_worker_exits_non_zero_with_the_reason(tmp_path):
    pool = write_pool(tmp_path, "litellm.ContextWindowExceededError")
    proc = conductor("run", "Q?", "--pool", str(pool), cwd=tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: step 0 (gpt) failed: openai/gpt-4o-mini: ContextWindowExceededError"
    )
    assert "Traceback" not in proc.stderr
    # The reason is said once (issue #16 measured five times), the steps' fate on their lines.
    assert proc.stderr.count("ContextWindowExceededError") == 1, proc.stderr
    assert "  ✗ step 0 · gpt failed" in proc.stderr and "  - step 1 · gpt skipped" in proc.stderr
    steps = conductor("artifacts", "--json", cwd=tmp_path)
    s = json.loads(steps.stdout)
    assert s["failed_runs"] == 1 and s["failed_steps"] == 1 and s["skipped_steps"] == 1


def test_verbose_brings_prefects_run_lines_back(tmp_path):
    pool = write_pool(tmp_path, "42")
    proc = conductor("run", "What is 17 + 25?", "--pool", str(pool), "--verbose", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "answer: 42\n"
    assert "Task run 'step-0 gpt' - Finished in state Completed()" in proc.stderr
    assert "  ✓ step 1 · gpt" in proc.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "model_id = [0, 0]\nsubtasks = ['a', 'b']\naccess_list = [[], [1]]",
            "error: step 1 reads itself",
        ),
        ("no plan here", "error: no plan found"),
        ("model_id = [" * 5000, "error: "),
    ],
)
def test_validate_rejects_with_one_line(tmp_path, text, message):
    f = tmp_path / "plan.txt"
    f.write_text(text)
    proc = conductor("validate", str(f), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith(message)


def test_validate_reads_stdin_and_prints_the_plan(tmp_path):
    proc = conductor("validate", "-", cwd=tmp_path, stdin="Reasoning...\n" + PLAN, timeout=60)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["steps"][1] == {
        "index": 1,
        "worker": "smol",
        "instruction": "answer",
        "access": [0],
    }


def test_validate_applies_the_pool(tmp_path):
    pool = write_pool(tmp_path, "x")
    proc = conductor(
        "validate",
        "-",
        "--pool",
        str(pool),
        cwd=tmp_path,
        stdin="model_id=[3]\nsubtasks=['a']\naccess_list=[[]]",
        timeout=60,
    )
    assert proc.returncode == 2
    assert "worker 3 does not exist" in proc.stderr


def test_plan_prints_the_validated_plan_without_running(tmp_path):
    pool = write_pool(tmp_path, "x")
    proc = conductor("plan", "Q?", "--pool", str(pool), "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [s["worker"] for s in json.loads(proc.stdout)["steps"]] == ["gpt", "gpt"]
    assert not (tmp_path / "home" / "artifacts").exists()  # nothing ran


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("conductor: {model: x}\nworkers: []\n", "workers: Tuple should have at least 1 item"),
        (
            "conductor: {model: x}\nworkers:\n  - {name: a}\n",
            "workers[0]: worker 'a' of kind 'llm' needs a model",
        ),
        (
            "conductor: {model: x}\nworkers:\n  - {name: a, model: m, params: {api_key: sk-1}}\n",
            "'api_key' must not be written in the pool file",
        ),
        (
            "conductor: {model: x}\nworkers:\n  - {name: c, kind: tool, model: tool/calculator,"
            " system: Be brief.}\n",
            "worker 'c': `system` is for llm workers",
        ),
        ("conductor: {model: x}\nworkers: [\n", "invalid YAML at line"),
        (
            "conductor: {model: x}\ndefault_worker: b\nworkers:\n  - {name: a, model: m}\n",
            "default_worker 'b' is not a worker",
        ),
    ],
)
def test_bad_pool_file_is_one_line_naming_file_and_field(tmp_path, content, expected):
    pool = tmp_path / "bad.yaml"
    pool.write_text(content)
    proc = conductor("run", "Q?", "--pool", str(pool), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.count("\n") == 0, line
    assert line.startswith(f"error: {pool}: ") and expected in line
    assert "sk-1" not in line


def test_missing_pool_file(tmp_path):
    proc = conductor("plan", "Q?", "--pool", str(tmp_path / "nope.yaml"), cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and "pool file not found" in proc.stderr


def test_artifacts_path_and_compact(tmp_path):
    proc = conductor("artifacts", "--path", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.strip() == str(tmp_path / "home" / "artifacts")
    compact = conductor("artifacts", "compact", "--json", cwd=tmp_path, timeout=60)
    assert compact.returncode == 0, compact.stderr
    json.loads(compact.stdout)


# What a hostile tool program or worker prints: retitle (OSC ... BEL), recolour (CSI, and the
# 8-bit CSI U+009B), a NUL (issue #38).
HOSTILE = "\x1b]0;PWNED-TITLE\x07\x1b[31mRED \x00 \x9b31m"
HOSTILE_SHOWN = "\\x1b]0;PWNED-TITLE\\x07\\x1b[31mRED \\x00 \\x9b31m"


def test_worker_output_reaches_the_terminal_escaped_and_json_exact(tmp_path):
    pool = write_pool(tmp_path, HOSTILE)
    proc = conductor("run", "Say hi", "--pool", str(pool), "--verbose", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"answer: {HOSTILE_SHOWN}\n"
    step_1 = next(line for line in proc.stderr.splitlines() if line.startswith("  ✓ step 1 · gpt"))
    assert step_1.endswith(f" s: {HOSTILE_SHOWN}")  # the step line, after its latency
    assert f"Flow run 'Say hi' - answer: {HOSTILE_SHOWN}\n" in proc.stderr  # Prefect's line
    for raw in ("\x1b", "\x07", "\x00", "\x9b"):
        assert raw not in proc.stdout and raw not in proc.stderr
    # --json keeps the exact text (JSON escapes it); so does the stored run.
    as_json = conductor("run", "Say hi", "--pool", str(pool), "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["answer"] == HOSTILE
    assert "\x1b" not in as_json.stdout and "\x1b" not in as_json.stderr
    from prefect_conductor.conductor.data.store import ArtifactStore

    runs = ArtifactStore(str(tmp_path / "home" / "artifacts")).read_pandas("runs")
    assert list(runs["answer"]) == [HOSTILE, HOSTILE]


def test_eval_with_one_oversized_question_runs_the_rest(tmp_path):
    """Issue #38: a question over 20,000 characters made `conductor eval` exit 1, storing
    nothing; now it is one failed run and the others run and are stored."""
    pool = write_tool_pool(tmp_path)
    data = tmp_path / "questions.jsonl"
    rows = [
        {"id": "ok", "question": "What is 2 + 3?", "reference": "5", "kind": "math"},
        {
            "id": "long",
            "question": "What is 2 + 3? " + " " * 20_000,
            "reference": "5",
            "kind": "math",
        },
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "--dataset", str(data), "--strategy", "single:calculator", "--pool", str(pool)]
    proc = conductor(*args, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (result["n"], result["correct"], result["failed"]) == (2, 1, 1)
    assert_clean(proc.stderr)
    summary = json.loads(conductor("artifacts", "--json", cwd=tmp_path).stdout)
    assert summary["runs"] == 2 and summary["failed_runs"] == 1


def test_run_takes_the_strategies_of_eval(tmp_path):
    """Issue #39: `--strategy` exists on `eval`, and now on `run` too."""
    pool = write_tool_pool(tmp_path)
    proc = conductor("run", "What is 6 * 7?", "--pool", str(pool), "--strategy",
                     "single:calculator", "--json", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["answer"] == "42" and [s["worker"] for s in data["workflow"]] == ["calculator"]
    bad = conductor("run", "Q?", "--pool", str(pool), "--strategy", "single:nobody", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --strategy: ")
    assert_clean(bad.stderr)
    both = conductor("run", "Q?", "--pool", str(pool), "--strategy", "random-plan",
                     "--best-of", "2", cwd=tmp_path)  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr
