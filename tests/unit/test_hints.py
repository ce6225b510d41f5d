"""Hints for verified self-sampling (``prefect_conductor.conductor.training.hints``, issue #18): worked
examples rendered for the pool, checked by the engine's parser, and given to the sampling
conductor only. A bad hint file given to the CLI is
``tests/integration/test_self_sample_hints_cli.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect_conductor.conductor.plan.parse import parse_plan
from prefect_conductor.conductor.plan.prompts import conductor_messages
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.training.config import TrainConductorRequest
from prefect_conductor.conductor.training.hints import (
    BUILTIN_HINTS,
    HintError,
    hint_rotations,
    load_hint,
)

POOL = load_pool()


def _file(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "hints.yaml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return str(path)


def test_the_built_in_word_problem_hint_gives_four_calculator_plans_as_earlier_turns():
    hint = load_hint("word-problems", POOL)
    assert hint.note == "" and len(hint.shots) == 4
    for shot in hint.shots:
        plan = parse_plan(shot.plan, POOL)  # the format the conductor writes
        assert [s.worker for s in plan.steps] == ["calculator"]
    assert "(8 + 4) * 9" in hint.shots[3].plan and "tulips" in hint.shots[3].question
    assert set(BUILTIN_HINTS) == {"word-problems", "one-operation"}


def test_the_built_in_one_operation_hint_is_text_after_the_instructions():
    hint = load_hint("one-operation", POOL)
    assert hint.shots == ()
    note, *shots = hint.note.split("\n\nQuestion: ")
    assert note.startswith("Word problems: write the arithmetic expression")
    assert len(shots) == 4
    for shot in shots:
        assert [s.worker for s in parse_plan(shot.split("\n", 1)[1], POOL).steps] == [
            "calculator"
        ]


def test_each_rotation_ends_with_its_own_example_and_keeps_them_all():
    """Sample k reads rotation k: every example comes last once, none is dropped, the note
    stays first, and the file's order is the last rotation (what load_hint returns); in
    either style."""
    turns = hint_rotations("word-problems", POOL)
    assert len(turns) == 4
    in_file = load_hint("word-problems", POOL).shots
    assert turns[-1].shots == in_file
    for k, hint in enumerate(turns):
        assert sorted(s.question for s in hint.shots) == sorted(s.question for s in in_file)
        assert hint.shots[-1] == in_file[k]
    text = hint_rotations("one-operation", POOL)
    in_text = load_hint("one-operation", POOL).note.split("\n\nQuestion: ")
    assert text[-1].note == "\n\nQuestion: ".join(in_text)
    for k, hint in enumerate(text):
        note, *shots = hint.note.split("\n\nQuestion: ")
        assert note == in_text[0]
        assert sorted(shots) == sorted(in_text[1:])
        assert shots[-1] == in_text[1 + k]


def test_a_built_in_hint_fits_a_pool_that_renames_its_calculator():
    """The built-in file names ``calculator``; a pool calling its calculator tool ``calc``
    gets the steps sent to ``calc`` (issue #40's own pool), and a name that is neither a
    worker nor a tool the pool has exactly once is still refused."""
    renamed = POOL.model_copy(
        update={
            "workers": [
                w.model_copy(update={"name": "calc"}) if w.name == "calculator" else w
                for w in POOL.workers
            ]
        }
    )
    for shot in load_hint("word-problems", renamed).shots:
        assert [s.worker for s in parse_plan(shot.plan, renamed).steps] == ["calc"]
    calc = next(w for w in renamed.workers if w.name == "calc")
    twice = renamed.model_copy(
        update={"workers": [*renamed.workers, calc.model_copy(update={"name": "c2"})]}
    )
    assert [w.model for w in twice.workers].count("tool/calculator") == 2
    with pytest.raises(HintError, match="worker 'calculator' is not in the pool"):
        load_hint("word-problems", twice)


def test_a_hint_may_hold_a_chain_of_steps(tmp_path):
    doc = {
        "examples": [
            {
                "question": "Twice the capital's letter count?",
                "steps": [
                    {"worker": "smol", "subtask": "Name the capital of Peru."},
                    {"worker": "python", "subtask": "print(2 * len('Lima'))", "access": [0]},
                ],
            }
        ]
    }
    text = load_hint(_file(tmp_path, doc), POOL).note
    plan = parse_plan(text.split("\n", 1)[1], POOL)
    assert [(s.worker, s.access) for s in plan.steps] == [("smol", ()), ("python", (0,))]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"examples": [{"question": "q", "steps": [{"worker": "gpt9", "subtask": "x"}]}]},
            "examples.0: worker 'gpt9' is not in the pool (workers: calculator, python, smol)",
        ),
        (
            {
                "examples": [
                    {"question": "q", "steps": [{"worker": "smol", "subtask": "x", "access": [1]}]}
                ]
            },
            "examples.0: ",
        ),
        ({"examples": []}, "examples: List should have at least 1 item"),
        ({"examples": [{"question": "q"}]}, "examples.0.steps: Field required"),
        ({"shots": []}, "examples: Field required (and 1 more)"),
        (
            {
                "examples": [{"question": "q", "steps": [{"worker": "smol", "subtask": "x"}]}],
                "x": 1,
            },
            "x: Extra inputs are not permitted",
        ),
        (
            {
                "style": "chat",
                "examples": [{"question": "q", "steps": [{"worker": "smol", "subtask": "x"}]}],
            },
            "style: Input should be 'instructions' or 'turns'",
        ),
        ("examples: [unclosed", "cannot read hint file"),
    ],
)
def test_a_bad_hint_file_is_one_error_naming_the_file_and_the_place(tmp_path, doc, message):
    path = _file(tmp_path, doc)
    with pytest.raises(HintError) as err:
        load_hint(path, POOL)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_hint_file_names_the_built_in_ones():
    with pytest.raises(
        HintError, match=r"^nope.yaml: no such hint file \(built-in: one-operation, word-problems\)"
    ):
        load_hint("nope.yaml", POOL)


def test_the_hint_goes_after_the_instructions_of_either_prompt_style():
    for style in ("full", "compact"):
        pool = POOL.model_copy(
            update={"conductor": POOL.conductor.model_copy(update={"prompt": style})}
        )
        plain = conductor_messages("Q?", pool)
        hinted = conductor_messages("Q?", pool.with_conductor_hint("  HINT  "))
        assert hinted[0]["content"] == plain[0]["content"] + "\n\nHINT"
        assert hinted[1:] == plain[1:]


def test_worked_examples_as_turns_come_between_the_instructions_and_the_question():
    """``style: turns``: each example is a user turn (its question) and an assistant turn
    (its plan, as the conductor writes it) before the question; the instructions are the
    plain ones, so a conductor trained on them reads what it was trained on."""
    pool = POOL.model_copy(
        update={"conductor": POOL.conductor.model_copy(update={"prompt": "compact"})}
    )
    hint = load_hint("word-problems", pool)
    plain = conductor_messages("Q?", pool)
    hinted = conductor_messages("Q?", pool.with_conductor_hint(hint))
    assert hinted[0] == plain[0] and hinted[-1] == plain[-1]
    middle = hinted[1:-1]
    assert [m["role"] for m in middle] == ["user", "assistant"] * 4
    assert middle[0]["content"] == f"Question: {hint.shots[0].question}"
    assert parse_plan(middle[-1]["content"], pool).steps[0].instruction == "(8 + 4) * 9"


def _sampled(monkeypatch, right=None, limit: int = 2, report: list | None = None, **stage) -> list:
    """The requests one self-sampling stage sends (``limit`` mixed training questions),
    unrun; with ``right(request)``, each is answered by a completed run, right or wrong as
    it says."""
    import prefect_conductor.flows._stages as tc
    from prefect_conductor.conductor.plan.requests import RunResult
    from prefect_conductor.conductor.training.config import StageReport
    from prefect_conductor.conductor.training.recipe import recipe_from_dict

    def result(request, correct: bool) -> RunResult:
        return RunResult(
            run_id=f"{request.question_id}-{request.seed}", status="completed", answer="1",
            workflow=[], input_tokens=0, output_tokens=0, cost_usd=None, wall_s=0.0,
            artifacts="", format_valid=True, correct=correct, reward=1.0 if correct else 0.5,
        )  # fmt: skip

    def run_all(requests, *a):
        sent.extend(requests)
        return [] if right is None else [result(r, right(r)) for r in requests]

    sent: list = []
    monkeypatch.setattr(tc, "_run_all", run_all)
    recipe = recipe_from_dict(
        {"dataset": "mixed", "seed": 5,
         "stages": [
             {"kind": "self-sample", "name": "round", "questions": {"limit": limit}, **stage}
         ]}
    )  # fmt: skip
    training = tc.Training(TrainConductorRequest(recipe=recipe), "run1", POOL)
    training.current = Path("/adapters/warm-start")
    monkeypatch.setattr(training, "sft", lambda *a, **k: StageReport(stage="round", kind="sft"))
    done = training.self_sample(recipe.stage("round"))
    if report is not None:
        report.append(done)
    return sent


def test_self_sampling_sends_the_hint_and_tags_the_runs(monkeypatch):
    """Only the sampling requests carry the hint; the tags say which file it was."""
    sent = _sampled(monkeypatch, num_generations=2, hints="word-problems")
    hints = hint_rotations("word-problems", POOL)
    assert len(sent) == 4
    assert {(r.seed, r.conductor_hint) for r in sent} == {(5, hints[0]), (6, hints[1])}
    assert {r.tags["self_sample_hints"] for r in sent} == {"word-problems"}
    assert {r.conductor for r in sent} == {"/adapters/warm-start"}
    plain = _sampled(monkeypatch, num_generations=2)
    assert {r.conductor_hint for r in plain} == {None}
    assert not any("self_sample_hints" in r.tags for r in plain)


def test_self_sampling_samples_at_its_stages_temperature_with_distinct_seeds(monkeypatch):
    sent = _sampled(monkeypatch, num_generations=3, temperature=0.5)
    assert {r.conductor_temperature for r in sent} == {0.5}
    assert sorted({r.seed for r in sent}) == [5, 6, 7]
    assert {r.tags["train_stage"] for r in sent} == {"round"}


def test_min_right_samples_again_only_the_questions_without_a_right_plan(monkeypatch):
    """``min_right``: after each batch of ``num_generations`` plans a question, another
    batch for the questions with no right plan yet, seeds going on (sample k: seed + k),
    until enough plans are right or ``max_generations``."""
    # The first question is right from its third sample on; the others never.
    first = _sampled(monkeypatch, limit=3, num_generations=2)[0].question_id
    report: list = []
    sent = _sampled(
        monkeypatch,
        right=lambda r: r.question_id == first and r.seed >= 7,
        limit=3,
        report=report,
        num_generations=2,
        min_right=5,
        max_generations=6,
    )
    by_question: dict[str, list[int]] = {}
    for r in sent:
        by_question.setdefault(r.question_id, []).append(r.seed)
    assert len(by_question) == 3
    assert by_question[first] == [5, 6, 7, 8]  # right at seed 7: not sampled again
    others = [seeds for q, seeds in by_question.items() if q != first]
    assert others == [[5, 6, 7, 8, 9, 10]] * 2  # never right: up to max_generations
    assert (report[0].rollouts, report[0].right) == (16, 2)
    # Enough right after the first batch: nothing more is sampled.
    enough = _sampled(monkeypatch, right=lambda r: True, limit=3, num_generations=2, min_right=5)
    assert len(enough) == 6
    # Without min_right, one batch whatever the outcome.
    once = _sampled(monkeypatch, right=lambda r: False, limit=3, num_generations=2)
    assert len(once) == 6


def test_min_right_defaults_to_four_batches_and_its_fields_are_checked():
    from prefect_conductor.conductor.training.recipe import recipe_from_dict

    def stage(**fields):
        recipe = recipe_from_dict(
            {"dataset": "mixed", "stages": [{"kind": "self-sample", "name": "s", **fields}]}
        )
        return recipe.stage("s")

    assert stage(num_generations=3).generation_cap == 3
    assert stage(num_generations=3, min_right=10).generation_cap == 12
    assert stage(num_generations=3, min_right=10, max_generations=5).generation_cap == 5
    for bad, words in (
        ({"max_generations": 8}, "max_generations needs min_right"),
        ({"min_right": 4, "max_generations": 2}, "must be at least num_generations"),
        ({"min_right": 4, "guide": {}}, "does not take a guide"),
    ):
        with pytest.raises(Exception, match=words):
            stage(num_generations=4, **bad)
