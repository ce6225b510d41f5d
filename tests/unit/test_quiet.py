"""Third-party notices and progress bars are configured off by defaults a user can override,
and libraries' deprecation warnings hidden (issue #10); the CLI applies all of it at start.
That each library reads the settings, in a fresh interpreter, is
``tests/integration/test_quiet_startup.py``."""

from __future__ import annotations

import logging
import warnings

from prefect_conductor.runtime.quiet import (
    hide_deprecation_warnings,
    progress_bars_off,
    quiet_third_party_notices,
)


def test_notices_are_off_by_default_and_a_users_setting_wins():
    env = {"MLFLOW_LOGGING_LEVEL": "DEBUG"}
    quiet_third_party_notices(env)
    assert env["MLFLOW_LOGGING_LEVEL"] == "DEBUG"
    assert env["PREFECT_LOGGING_LEVEL"] == "WARNING"
    # The runs' own progress keeps INFO.
    assert env["PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL"] == "INFO"
    assert env["PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL"] == "INFO"


def test_progress_bars_off_covers_tqdm_and_hugging_face():
    env: dict[str, str] = {}
    progress_bars_off(env)
    assert env["TQDM_DISABLE"] == "1"
    assert env["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1"
    assert env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


def test_deprecations_are_hidden_and_other_warnings_show():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hide_deprecation_warnings()
        warnings.warn("`gradient_checkpointing` is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("old", DeprecationWarning, stacklevel=1)
        warnings.warn("look at this", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["look at this"]


def test_the_runs_log_lines_stay_off_the_terminal_unless_verbose(monkeypatch):
    import prefect_conductor.runtime.quiet as quiet

    def record(name: str, level: int = logging.INFO) -> logging.LogRecord:
        return logging.LogRecord(
            name, level, __file__, 1, "Finished in state Completed()", (), None
        )

    monkeypatch.setattr(quiet, "_verbose", False)
    flt = quiet._QuietFilter()
    assert not flt.filter(record("prefect.task_runs"))
    assert not flt.filter(record("prefect.flow_runs", logging.ERROR))  # the reason is ours to say
    assert flt.filter(record("transformers.modeling_utils", logging.WARNING))
    env: dict[str, str] = {}
    quiet.verbose_output(env)
    assert env == {"PREFECT_LOGGING_LEVEL": "INFO", "MLFLOW_LOGGING_LEVEL": "INFO"}
    assert flt.filter(record("prefect.task_runs"))


def test_progress_lines_say_each_steps_fate_once():
    from prefect_conductor.conductor.plan.workflow import Step, plan_lines, step_line

    steps = [Step(index=0, worker="calc", instruction="2+2"), Step(index=1, worker="smol",
             instruction="say it", access=(0,))]  # fmt: skip
    assert plan_lines(steps) == [
        "plan:",
        "  step 0 · calc reads [-]: 2+2",
        "  step 1 · smol reads [0]: say it",
    ]
    assert plan_lines(steps, "no plan found")[0].startswith("invalid plan (no plan found)")
    assert step_line(steps[0], "completed", "4\n\n", 0.04) == "  ✓ step 0 · calc · 0.0 s: 4"
    assert step_line(steps[1], "completed", "x" * 200).endswith("x" * 80 + "…")
    assert step_line(steps[1], "failed") == "  ✗ step 1 · smol failed"
    assert step_line(steps[1], "skipped") == "  - step 1 · smol skipped"
