"""prefect_conductor.reward_model.pairs: OrchRM's win/lose pairs from small synthetic runs and steps tables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prefect_conductor.conductor.data.records import (
    RUNS_SCHEMA,
    STEPS_SCHEMA,
    RunRecord,
    StepRecord,
)
from prefect_conductor.conductor.data.store import ArtifactStore
from prefect_conductor.reward_model.pairs import (
    PAIR_SOURCES,
    PairConfig,
    PairSet,
    build_pairs,
    pairs_table,
    plan_document,
    raw_plan_document,
    reward_input,
    split_of,
    truncate,
)

POOL = "calculator: exact arithmetic\nsmol: reads prose"
SECRET = "SECRET-REFERENCE-42"
Plan = Sequence[tuple[str, str]]  # (worker, subtask); step i reads every earlier step


def lists(plan: Plan) -> dict[str, list[Any]]:
    return {
        "model_id": [w for w, _ in plan],
        "subtasks": [t for _, t in plan],
        "access_list": [list(range(i)) for i in range(len(plan))],
    }


def run(
    run_id: str,
    question_id: str = "q1",
    plan: Plan = (("calculator", "17 + 25"),),
    *,
    correct: bool | None = True,
    reward: float | None = None,
    model: str = "(single:calculator)",
    text: str | None = None,
    valid: bool = True,
    status: str = "completed",
) -> dict[str, Any]:
    """A runs row with every RunRecord field; the reward follows the paper (0 / 0.5 / 1)."""
    if reward is None and correct is not None:
        reward = (1.0 if correct else 0.5) if valid else 0.0
    return dict(
        run_id=run_id,
        question_id=question_id,
        question=f"What is the answer to {question_id}?",
        reference=SECRET,
        conductor_model=model,
        conductor_output=text,
        workflow_json=json.dumps(lists(plan)) if plan else None,
        format_valid=valid,
        format_error=None if valid else "no model_id list",
        answer="42",
        correct=correct,
        reward=reward,
        status=status,
        input_tokens=100,
        output_tokens=10,
        cost_usd=None,
        wall_s=1.0,
        created_at=datetime(2025, 1, 1, tzinfo=timezone.utc),
        tags={"strategy": "conductor", "sample": "0"},
    )


def steps_of(row: dict[str, Any], outcomes: Sequence[tuple[str, str | None]], depth: int = 0):
    """Step rows of ``row``'s plan: ``outcomes[i]`` is (status, output or error)."""
    plan = json.loads(row["workflow_json"])
    return [
        dict(
            run_id=row["run_id"],
            question_id=row["question_id"],
            step=i,
            depth=depth,
            worker=plan["model_id"][i],
            model="tool",
            instruction=plan["subtasks"][i],
            access=plan["access_list"][i],
            output=text if status == "completed" else None,
            status=status,
            error=text if status == "failed" else None,
            input_tokens=1,
            output_tokens=1,
        )
        for i, (status, text) in enumerate(outcomes)
    ]


def frames(runs: list[dict[str, Any]], steps: Sequence[dict[str, Any]] = ()):
    """DataFrames shaped like ``ArtifactStore.read_pandas`` (tags as key/value tuples)."""
    rows = [{**r, "tags": list(r["tags"].items())} for r in runs]
    return (
        pd.DataFrame(rows, columns=RUNS_SCHEMA.names),
        pd.DataFrame(list(steps), columns=STEPS_SCHEMA.names),
    )


def build(runs: list[dict[str, Any]], steps: Sequence[dict[str, Any]] = (), **kw: Any) -> PairSet:
    return build_pairs(*frames(runs, steps), pool_description=POOL, **kw)


def of(pairs: PairSet, source: str) -> pd.DataFrame:
    return pairs.pairs[pairs.pairs["source"] == source]


# -- documents -------------------------------------------------------------------------------


def test_plan_document_names_workers_and_shows_outputs_only_when_given():
    plan = lists([("calculator", "17 +\n 25"), ("smol", "Say it"), ("python", "print(1)")])
    assert plan_document(plan) == (
        "step 0 · calculator · reads [-]: 17 + 25\n"
        "step 1 · smol · reads [0]: Say it\n"
        "step 2 · python · reads [0, 1]: print(1)"
    )
    outputs = [("completed", "42\n"), ("failed", "timeout after 30 s"), ("skipped", None)]
    assert plan_document(plan, outputs).splitlines()[1::2] == [
        "  -> 42",
        "  -> failed: timeout after 30 s",
        "  -> skipped",
    ]
    cut = plan_document(plan, [("completed", "x" * 50)], max_output_chars=10).splitlines()
    assert cut[1] == "  -> " + "x" * 9 + "…" and len(cut) == 4  # steps 1, 2: no output line
    with pytest.raises(ValueError, match="equal length"):
        plan_document({"model_id": ["a"], "subtasks": [], "access_list": [[]]})


def test_raw_plan_and_prompt_texts():
    assert raw_plan_document("  model_id = [oops \n") == "unparsed plan:\nmodel_id = [oops"
    assert reward_input(" What is 2 + 2? ", POOL + "\n") == (
        "Question: What is 2 + 2?\nWorkers: calculator: exact arithmetic\nsmol: reads prose\nPlan:"
    )


def test_truncate_keeps_the_longest_prefix_within_budget():
    assert truncate("abcdefghij", 4, len) == ("abcd", True)
    assert truncate("abcd", 4, len) == ("abcd", False)
    words = "one two three four five six seven"

    def count(s: str) -> int:
        return len(s.split())

    text, cut = truncate(words, 3, count)
    assert cut and count(text) <= 3 and count(words[: len(text) + 1]) > 3
    assert text == "one two three " and truncate("", 0, len) == ("", False)


def test_split_of_is_stable_by_question_and_near_the_fraction():
    ids = [f"q{i}" for i in range(2000)]
    splits = [split_of(q, 0.2) for q in ids]
    assert splits == [split_of(q, 0.2) for q in ids]
    assert 0.17 < splits.count("test") / len(ids) < 0.23
    assert splits != [split_of(q, 0.2, seed=1) for q in ids]
    assert {split_of(q, 0.0) for q in ids} == {"train"} and {split_of(q, 1.0) for q in ids} == {
        "test"
    }
    with pytest.raises(ValueError, match="test_fraction"):
        split_of("q1", 1.5)


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_tokens"):
        PairConfig(max_tokens=0)
    with pytest.raises(ValueError, match="test_fraction"):
        PairConfig(test_fraction=-0.1)


# -- sources ---------------------------------------------------------------------------------


def test_correct_over_incorrect_with_and_without_outputs():
    right = run("r1", plan=[("calculator", "17 + 25")])
    wrong = run("r2", plan=[("smol", "17 + 25")], correct=False)
    steps = steps_of(right, [("completed", "42")]) + steps_of(wrong, [("completed", "32")])
    pairs = of(build([right, wrong], steps), "correct-over-incorrect")
    assert len(pairs) == 2
    assert set(pairs["chosen"]) == {
        "step 0 · calculator · reads [-]: 17 + 25",
        "step 0 · calculator · reads [-]: 17 + 25\n  -> 42",
    }
    assert set(pairs["rejected"]) == {
        "step 0 · smol · reads [-]: 17 + 25",
        "step 0 · smol · reads [-]: 17 + 25\n  -> 32",
    }
    assert list(pairs["margin"]) == [0.5, 0.5] and set(pairs["chosen_run_id"]) == {"r1"}
    assert set(pairs["input"]) == {reward_input("What is the answer to q1?", POOL)}
    plan_only = build([right, wrong], steps, config=PairConfig(with_outputs=False))
    assert len(plan_only.pairs) == 1 and not plan_only.pairs["chosen"].str.contains("->").any()


def test_no_outcome_pairs_when_all_correct_or_unverified():
    a, b = run("r1"), run("r2", plan=[("smol", "17 + 25")])
    assert build([a, b]).stats["pairs"] == 0  # both correct
    unverified = [run("r1", correct=None), run("r2", plan=[("smol", "x")], correct=False)]
    built = build(unverified)
    assert built.stats["by_source"]["correct-over-incorrect"] == 0
    assert built.stats["by_source"]["prefix-correct-over-wrong"] == 0


def test_a_failed_run_still_counts_when_verified():
    right = run("r1")
    broken = run("r2", plan=[("smol", "17 + 25")], correct=False, status="failed")
    assert build([right, broken]).stats["by_source"]["correct-over-incorrect"] == 1


def test_valid_over_invalid():
    conductor = "local/base"
    valid = run("r1", model=conductor, text="model_id = ['calculator']")
    invalid = run("r2", model=conductor, text=" I think the answer is 42 ", valid=False)
    pairs = of(build([valid, invalid]), "valid-over-invalid")
    assert list(pairs["rejected"]) == ["unparsed plan:\nI think the answer is 42"]
    assert list(pairs["chosen"]) == ["step 0 · calculator · reads [-]: 17 + 25"]
    # The outcome contradicts the format: no pair.
    lucky = run("r2", model=conductor, text="42", valid=False, correct=True)
    assert of(build([run("r1", correct=False), lucky]), "valid-over-invalid").empty
    # A baseline that wrote no plan text is not a conductor's invalid plan.
    baseline = run("r2", model="(single:smol)", valid=False)
    assert of(build([valid, baseline]), "valid-over-invalid").empty


def test_step_completed_over_failed_uses_the_prefix_with_outputs():
    plan = [("calculator", "17 + 25"), ("smol", "Explain 42"), ("smol", "Answer")]
    a = run("r1", plan=plan, correct=None)  # unverified: this source does not need outcomes
    b = run("r2", plan=plan, correct=None)
    steps = steps_of(a, [("completed", "42"), ("completed", "It is 42"), ("completed", "42")])
    steps += steps_of(b, [("completed", "42"), ("failed", "timeout"), ("skipped", None)])
    pairs = of(build([a, b], steps), "step-completed-over-failed")
    assert len(pairs) == 1
    (pair,) = pairs.to_dict("records")
    assert pair["chosen"].endswith("step 1 · smol · reads [0]: Explain 42\n  -> It is 42")
    assert pair["rejected"].endswith("  -> failed: timeout") and "step 2" not in pair["rejected"]
    assert (pair["chosen_run_id"], pair["rejected_run_id"]) == ("r1", "r2")
    # Another worker's completed step is no evidence: a language model always "completes"
    # where a tool given prose fails, whatever the question needs.
    other = run("r3", plan=[plan[0], ("python", "Explain 42")], correct=None)
    done = steps_of(other, [("completed", "42"), ("completed", "printed")])
    assert of(build([other, b], done + steps[3:]), "step-completed-over-failed").empty
    # A failure inside a recursive sub-plan (depth 1) is not a top-level step.
    nested = steps_of(a, [("completed", "42")]) + steps_of(b, [("failed", "boom")], depth=1)
    assert of(build([a, b], nested), "step-completed-over-failed").empty


def test_prefix_correct_over_wrong_pairs_differing_prefixes_only():
    right = run("r1", plan=[("calculator", "17 + 25"), ("smol", "Say the result")])
    wrong = run("r2", plan=[("smol", "17 + 25"), ("smol", "Say the result")], correct=False)
    pairs = of(
        build([right, wrong], config=PairConfig(with_outputs=False)), "prefix-correct-over-wrong"
    )
    # k = 2 is the whole plan: the correct-over-incorrect pair already has it.
    assert list(pairs["chosen"]) == ["step 0 · calculator · reads [-]: 17 + 25"]
    assert list(pairs["rejected"]) == ["step 0 · smol · reads [-]: 17 + 25"]
    same_start = run("r2", plan=[("calculator", "17 + 25"), ("python", "x")], correct=False)
    assert of(build([right, same_start]), "prefix-correct-over-wrong").empty


def test_specialized_over_base_needs_a_base_and_a_better_reward():
    # A valid but wrong plan (reward 0.5) over the base's unparseable text, whose fallback plan
    # happened to answer right (reward 0: the paper's reward puts the format first). The
    # valid-over-invalid source skips this pair as contradicted by the outcome.
    trained = run("r1", model="local/trained", text="model_id = ['calculator']", correct=False)
    base = run("r2", model="local/base", text="the answer", valid=False, correct=True)
    built = build([trained, base], base_conductor="local/base")
    pairs = of(built, "specialized-over-base")
    assert list(pairs["rejected"]) == ["unparsed plan:\nthe answer"]  # what the base wrote
    assert list(pairs["chosen"]) == ["step 0 · calculator · reads [-]: 17 + 25"]
    assert list(pairs["margin"]) == [0.5] and len(built.pairs) == 1
    none = build([trained, base])
    assert none.pairs.empty and none.stats["by_source"]["specialized-over-base"] == 0
    better_base = run("r2", model="local/base", text="t", plan=[("smol", "x")])
    assert of(
        build([trained, better_base], base_conductor="local/base"), "specialized-over-base"
    ).empty
    # A baseline strategy is not a trained conductor.
    single = run("r1", model="(single:calculator)", correct=False)
    assert build([single, base], base_conductor="local/base").pairs.empty


def test_a_pair_two_sources_give_is_kept_by_the_first():
    trained = run("r1", model="local/trained", text="model_id = ['calculator']")
    base = run("r2", model="local/base", text="the answer", valid=False, correct=False)
    built = build(
        [trained, base], base_conductor="local/base", config=PairConfig(with_outputs=False)
    )
    # Both valid-over-invalid and specialized-over-base (reward 1 > 0) give this pair; the
    # more specific label, first in PAIR_SOURCES, keeps it.
    assert PAIR_SOURCES[0] == "specialized-over-base"
    assert list(built.pairs["source"]) == ["specialized-over-base"]
    assert list(built.pairs["rejected"]) == ["unparsed plan:\nthe answer"]


# -- hygiene ---------------------------------------------------------------------------------


def test_duplicate_runs_give_one_pair():
    wrong = run("r9", plan=[("smol", "17 + 25")], correct=False)
    twins = [run("r1"), run("r2"), wrong]
    pairs = build(twins, config=PairConfig(with_outputs=False)).pairs
    assert len(pairs) == 1 and pairs["pair_id"].is_unique
    # Plans equal up to whitespace render the same document: one pair too.
    spaced = run("r3", plan=[("calculator", " 17  +  25 ")])
    assert len(build([run("r1"), spaced, wrong], config=PairConfig(with_outputs=False)).pairs) == 1


def test_cap_per_question_is_a_seeded_draw():
    runs = [run(f"a{i}", plan=[("calculator", f"{i} + 1")]) for i in range(5)]
    runs += [run(f"b{i}", plan=[("smol", f"{i} + 1")], correct=False) for i in range(5)]
    runs += [run(f"c{i}", "q2", plan=[("calculator", f"{i}")]) for i in range(2)]
    runs += [run("d0", "q2", plan=[("smol", "0")], correct=False)]
    config = PairConfig(max_per_question=3, with_outputs=False)
    first, again = build(runs, config=config), build(list(reversed(runs)), config=config)
    counts = of(first, "correct-over-incorrect")["question_id"].value_counts().to_dict()
    assert counts == {"q1": 3, "q2": 2}
    assert list(first.pairs["pair_id"]) == list(again.pairs["pair_id"])  # row order is irrelevant
    other = build(runs, config=PairConfig(max_per_question=3, with_outputs=False, seed=7))
    assert set(other.pairs["pair_id"]) != set(first.pairs["pair_id"])


def test_no_question_is_on_both_sides_of_the_split():
    runs = []
    for q in range(40):
        runs += [run(f"a{q}", f"q{q}"), run(f"b{q}", f"q{q}", plan=[("smol", "x")], correct=False)]
    pairs = build(runs, config=PairConfig(test_fraction=0.5)).pairs
    assert (pairs.groupby("question_id")["split"].nunique() == 1).all()
    assert set(pairs["split"]) == {"train", "test"}
    assert all(
        split_of(q, 0.5) == s for q, s in zip(pairs["question_id"], pairs["split"], strict=True)
    )


def test_truncation_respects_the_budget_and_is_counted():
    def words(s: str) -> int:
        return len(s.split())

    long = " ".join(f"w{i}" for i in range(40))
    right = run("r1", plan=[("calculator", long)])
    wrong = run("r2", plan=[("smol", long)], correct=False)
    built = build([right, wrong], count_tokens=words, config=PairConfig(max_tokens=6))
    pairs = built.pairs
    assert len(pairs) >= 1 and pairs["truncated"].all()
    assert all(words(t) <= 6 for t in [*pairs["chosen"], *pairs["rejected"]])
    assert built.stats["truncated"] == len(pairs) and built.stats["max_tokens"] == 6
    # Plans that differ only beyond the budget are equal once cut: no pair.
    late = run("r2", plan=[("calculator", long + " extra")], correct=False)
    assert build([right, late], count_tokens=words, config=PairConfig(max_tokens=6)).pairs.empty
    assert not build([right, wrong]).pairs["truncated"].any()  # default budget: nothing cut
    # One side cut is enough to mark the pair.
    short = run("r1", plan=[("calculator", "17 + 25")])
    one_side = build([short, wrong], count_tokens=words, config=PairConfig(max_tokens=10)).pairs
    assert len(one_side) >= 1 and one_side["truncated"].all()
    assert set(one_side["chosen"]) == {"step 0 · calculator · reads [-]: 17 + 25"}  # 10 words


def test_the_reference_column_is_never_read():
    right = run("r1", text="plan")
    wrong = run("r2", plan=[("smol", "17 + 25")], correct=False, text="plan")
    steps = steps_of(right, [("completed", "42")])
    runs, steps_frame = frames([right, wrong], steps)
    with_ref = build_pairs(runs, steps_frame, pool_description=POOL)
    without = build_pairs(runs.drop(columns=["reference"]), steps_frame, pool_description=POOL)
    pd.testing.assert_frame_equal(with_ref.pairs, without.pairs)
    assert with_ref.stats == without.stats and len(with_ref.pairs) > 0
    text = " ".join(with_ref.pairs[["input", "chosen", "rejected"]].to_numpy().ravel())
    assert SECRET not in text
    with pytest.raises(ValueError, match="workflow_json"):
        build_pairs(runs.drop(columns=["workflow_json"]), steps_frame, pool_description=POOL)


def test_stats_add_up():
    plan = [("calculator", "17 + 25"), ("smol", "Say it"), ("smol", "Answer")]
    right = run("r1", plan=plan, model="local/trained", text="t", correct=False)
    wrong = run("r2", plan=[("smol", "17 + 25"), *plan[1:]], correct=False)
    luckier = run("r3", plan=[("python", "print(42)")])
    base = run("r4", model="local/base", text="no plan", valid=False, correct=True)
    steps = steps_of(right, [("completed", "42"), ("completed", "42"), ("completed", "42")])
    steps += steps_of(wrong, [("completed", "32"), ("failed", "boom"), ("skipped", None)])
    built = build([right, wrong, luckier, base], steps, base_conductor="local/base")
    stats, pairs = built.stats, built.pairs
    assert sum(stats["by_source"].values()) == stats["pairs"] == len(pairs)
    assert stats["train"] + stats["test"] == len(pairs) and list(stats["by_source"]) == list(
        PAIR_SOURCES
    )
    assert (
        stats["by_source"]
        == pairs["source"].value_counts().reindex(PAIR_SOURCES, fill_value=0).to_dict()
    )
    assert all(stats["by_source"][s] > 0 for s in PAIR_SOURCES), stats["by_source"]
    for source in PAIR_SOURCES:
        mine = of(built, source)
        ids = set(mine["chosen_run_id"]) | set(mine["rejected_run_id"])
        assert stats["runs_used"][source] == len(ids)
        assert stats["rollout_tokens"][source] == 110 * len(ids)
        assert stats["pairs_per_1k_tokens"][source] == pytest.approx(len(mine) / (0.11 * len(ids)))
    overall = len(pairs) / (4 * 0.11)  # every run appears in some pair
    assert stats["all_sources_pairs_per_1k_tokens"] == pytest.approx(overall)
    coi = stats["pairs_per_1k_tokens"]["correct-over-incorrect"]
    assert stats["efficiency_vs_correct_over_incorrect"] == pytest.approx(overall / coi)
    empty = build([run("r1")]).stats
    assert empty["pairs"] == 0 and empty["efficiency_vs_correct_over_incorrect"] is None
    assert empty["pairs_per_1k_tokens"]["correct-over-incorrect"] is None


def test_pairs_from_runs_without_a_reference_are_counted_per_source():
    conductor = "local/base"
    # Question q1: everyday runs, no reference (correct None): a valid plan and an unparsed one.
    valid = run("r1", model=conductor, text="model_id = ['calculator']", correct=None)
    invalid = run("r2", model=conductor, text="42?", valid=False, correct=None)
    # Question q2: verified runs: the same two kinds, and a wrong plan.
    checked = run("r3", "q2", model=conductor, text="model_id = ['calculator']")
    broken = run("r4", "q2", model=conductor, text="hm", valid=False, correct=False)
    wrong = run("r5", "q2", plan=[("smol", "17 + 25")], correct=False)
    built = build([valid, invalid, checked, broken, wrong])
    assert built.stats["by_source"]["valid-over-invalid"] == 3  # q1's, q2's two
    assert built.stats["unreferenced"]["valid-over-invalid"] == 1  # q1's only
    assert built.stats["by_source"]["correct-over-incorrect"] >= 1
    assert built.stats["unreferenced"]["correct-over-incorrect"] == 0
    assert set(built.stats["unreferenced"]) == set(PAIR_SOURCES)


# -- storage ---------------------------------------------------------------------------------


def _two_runs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    right = run("r1", plan=[("calculator", "17 + 25"), ("smol", "Say it")], text="plan")
    wrong = run("r2", plan=[("smol", "17 + 25"), ("smol", "Say it")], correct=False)
    invalid = run("r3", model="local/base", text="garbage", valid=False, correct=None, plan=())
    steps = steps_of(right, [("completed", "42"), ("completed", "It is 42")])
    steps += steps_of(wrong, [("completed", "32"), ("failed", "boom")])
    return [right, wrong, invalid], steps


def test_frames_read_from_the_store_give_the_same_pairs(tmp_path: Path):
    runs, steps = _two_runs()
    store = ArtifactStore(tmp_path)
    store.write([RunRecord(**r) for r in runs], [StepRecord(**s) for s in steps])
    stored = build_pairs(
        store.read_pandas("runs"), store.read_pandas("steps"), pool_description=POOL
    )
    by_hand = build(runs, steps)
    key = ["source", "pair_id"]
    pd.testing.assert_frame_equal(
        stored.pairs.sort_values(key).reset_index(drop=True),
        by_hand.pairs.sort_values(key).reset_index(drop=True),
    )
    assert stored.stats == by_hand.stats and stored.stats["pairs"] >= 4


def test_pairs_table_round_trips_through_the_store(tmp_path: Path):
    built = build(*_two_runs())
    stamp = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
    store = ArtifactStore(tmp_path)
    assert store.write_pairs(pairs_table(built.pairs, "mlflow-abc", created_at=stamp)) is not None
    got = store.read_pandas("pairs")
    assert set(got["pair_set"]) == {"mlflow-abc"} and set(got["created_at"]) == {
        pd.Timestamp(stamp)
    }
    got = got.drop(columns=["pair_set", "created_at"]).sort_values("pair_id").reset_index(drop=True)
    expected = built.pairs.sort_values("pair_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected)
    assert got["margin"].isna().any() and got["margin"].notna().any()  # nulls survive
    empty = pairs_table(built.pairs.iloc[:0], "mlflow-abc")
    assert empty.num_rows == 0 and store.write_pairs(empty) is None


def test_runs_of_different_questions_sharing_an_id_never_pair():
    # Generated datasets reuse ids across seeds: same id, different question text.
    right = run("r1", plan=[("calculator", "1 + 1")], correct=True)
    other = {**run("r2", plan=[("smol", "2 + 2")], correct=False), "question": "What is 2 + 2?"}
    assert build([right, other]).pairs.empty
    same = run("r3", plan=[("smol", "1 + 1")], correct=False)
    assert not of(build([right, same]), "correct-over-incorrect").empty
