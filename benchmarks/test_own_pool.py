"""The pool and data set of ``python -m benchmarks.own_pool`` (issue #40, point 5), and its
bookkeeping: cheap tests only, no model and no training.

References are recomputed here from the question text alone (the calculator's own ``ast``
evaluator for expressions, a reading of the words for the rest; programs run in one
subprocess), and the held-out phrasings are checked against train's on the text itself."""

from __future__ import annotations

import doctest
import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prefect_conductor.conductor.data.datasets import load_dataset
from prefect_conductor.conductor.pool import load_pool
from prefect_conductor.conductor.providers.tools.calculator import evaluate

import benchmarks.own_pool as own


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return own.build_rows()


def _ints(question: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", question)]


def _words(q: str) -> int:
    """Arithmetic in words, read back from the sentence."""
    n = _ints(q)
    if "sum of" in q and "multiply" in q:
        return (n[0] + n[1]) * n[2]
    if "sum of" in q or "total of" in q:
        return n[0] + n[1]
    if " plus " in q and " minus " in q:
        return n[0] + n[1] - n[2]
    if "then add" in q:
        return n[0] * n[1] + n[2]
    if "multiply" in q:
        return n[0] * n[1]
    if q.startswith("Subtract") or "away from" in q:  # "subtract B from A": A - B
        return n[1] - n[0]
    if "difference between" in q:
        return abs(n[0] - n[1])
    if q.startswith("Divide"):
        assert n[0] % n[1] == 0, q
        return n[0] // n[1]
    if "go into" in q:  # "how many times does B go into A": A / B
        assert n[1] % n[0] == 0, q
        return n[1] // n[0]
    if "less than" in q and "times" in q:  # "C less than A times B"
        return n[1] * n[2] - n[0]
    raise AssertionError(f"no reading for {q!r}")


def _story(q: str) -> int:
    """The word problems' arithmetic, read back from the story."""
    n = _ints(q)
    if "restaurant bill" in q:
        assert n[1] % n[0] == 0, q
        return n[1] // n[0] + n[2]
    if "balloons" in q:
        assert n[0] % n[1] == 0, q
        return n[0] // n[1] - n[2]
    if "Museum" in q:  # adult price, child price, adults, children
        return n[2] * n[0] + n[3] * n[1]
    if "bus tickets" in q:  # change from the note
        return n[2] - n[0] * n[1]
    if "stamps" in q:
        return n[0] + n[1] - n[2]
    if any(k in q for k in ("cinema", "shelves", "jogs")):
        return n[0] * n[1] + n[2]
    if any(k in q for k in ("trays of", "saves", "car park", "eggs per cake")):
        return n[0] * n[1] - n[2]
    raise AssertionError(f"no reading for {q!r}")


def _expression(q: str) -> str:
    """The longest run of digits, operators and brackets in the question."""
    runs = re.findall(r"[\d(][\d\s()+\-*/]*[\d)]", q)
    return max(runs, key=len).strip()


def test_the_pool_renames_and_reorders_the_local_workers_and_adds_a_rhyming_poet(tmp_path):
    pool_path, data_path = own.write_inputs(tmp_path)
    pool, local = load_pool(pool_path), load_pool(None)
    assert [w.name for w in pool.workers] == ["runner", "poet", "chat", "calc"]
    assert not {w.name for w in pool.workers} & {w.name for w in local.workers}
    assert {w.model for w in pool.workers} == {w.model for w in local.workers}
    assert {w.description for w in pool.workers}.isdisjoint(w.description for w in local.workers)
    poet, chat = pool.worker("poet"), pool.worker("chat")
    assert poet.model == chat.model and poet.kind == "llm"
    assert "rhyming verse" in (poet.system or "") and poet.system != chat.system
    assert pool.default.name == "chat" and pool.conductor.model != local.conductor.model
    # the file loads as a data set, and writing the same inputs again is a no-op
    assert [len(load_dataset(str(data_path), split=s)) for s in ("train", "test")] == [240, 60]
    assert own.write_inputs(tmp_path) == (pool_path, data_path)
    data_path.write_text(data_path.read_text().replace("Tokyo", "Kyoto"))
    with pytest.raises(SystemExit, match="another --home"):
        own.write_inputs(tmp_path)


def test_the_splits_are_balanced_interleaved_seeded_and_share_no_question(rows):
    counts = Counter((r["split"], r["domain"]) for r in rows)
    assert counts == {(s, d): n // 5 for s, n in own.SIZES.items() for d in own.DOMAINS}
    for split in own.SIZES:
        domains = [r["domain"] for r in rows if r["split"] == split]
        assert domains[:10] == list(own.DOMAINS) * 2  # every prefix balanced
    questions = [r["question"] for r in rows]
    assert len(set(questions)) == len(questions)
    assert {r["kind"] for r in rows} == {"math", "text"}
    assert own.build_rows() == rows and own.build_rows(1) != rows


def test_references_are_recomputed_from_the_question_text(rows):
    seen = Counter()
    for r in rows:
        q, ref = r["question"], r["reference"]
        if r["domain"] == "expressions":
            expression = _expression(q)
            assert "(" in expression, q  # the brackets change the value
            assert evaluate(expression) == ref, q
            assert evaluate(expression.replace("(", "").replace(")", "")) != ref, q
        elif r["domain"] == "arith-words":
            assert str(_words(q)) == ref and int(ref) >= 0, q
        elif r["domain"] == "word-problems":
            assert str(_story(q)) == ref and int(ref) >= 0, q
        else:
            continue
        seen[r["domain"]] += 1
    assert seen == {"expressions": 60, "arith-words": 60, "word-problems": 60}


def test_every_program_prints_its_reference(rows):
    """All programs in one subprocess, each wrapped in a function of its own."""
    programs = [r for r in rows if r["domain"] == "programs"]
    script = ""
    for i, r in enumerate(programs):
        source = re.search(r"```python\n(.*?)\n```", r["question"], re.S).group(1)
        script += f"def p{i}():\n{textwrap.indent(source, '    ')}\n\n"
        script += f"p{i}()\nprint('@@@')\n"
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    printed = done.stdout.split("@@@\n")[:-1]
    assert [p.strip() for p in printed] == [r["reference"] for r in programs]
    assert {r["task"] for r in programs} == {
        "even_sum", "swap_calls", "multiples", "first_sorted", "fib_like", "stock",
        "digit_sum", "long_words"}  # fmt: skip


def _skeleton(r: dict) -> str:
    """A question's phrasing: its program, subject, numbers and names taken out."""
    q = re.sub(r"```python\n.*?\n```", "<code>", r["question"], flags=re.S)
    if r.get("subject"):
        q = q.replace(r["subject"], "<s>")
    q = re.sub(r"\d+", "#", q)
    return re.sub(r"\b[A-Z][a-z]+\b", "<W>", q)


def test_test_phrasings_are_never_train_phrasings(rows):
    by_split: dict[str, dict[str, set]] = {s: {} for s in own.SIZES}
    for r in rows:
        kinds = by_split[r["split"]].setdefault(r["domain"], set())
        kinds.add(_skeleton(r))
    for domain in own.DOMAINS:
        train, test = by_split["train"][domain], by_split["test"][domain]
        assert train.isdisjoint(test), (domain, train & test)
        assert len(test) >= 3 and len(train) > len(test), domain  # several of each
    templates = {s: {r["template"] for r in rows if r["split"] == s} for s in own.SIZES}
    assert templates["train"].isdisjoint(templates["test"])
    # and the facts asked in test are other facts than train's
    facts = {s: {(r["template"].split(":")[0], r["subject"]) for r in rows
                 if r["split"] == s and r["domain"] == "facts"} for s in own.SIZES}  # fmt: skip
    assert facts["train"].isdisjoint(facts["test"])


def test_the_goals_are_counted_exactly():
    met = own.goal_rows(60, 22, ("single:calc", 13), 24)
    assert [g["met"] for g in met] == [True, True]  # 22/60 = 13/60 + 15 points; 22 >= 21.6
    assert not 22 / 60 >= 13 / 60 + 0.15  # what floats would have said
    assert [g["met"] for g in own.goal_rows(60, 21, ("single:calc", 13), 24)] == [False, False]
    assert met[1]["share_of_oracle"] == 22 / 24 and met[1]["target"] == 0.9 * 24 / 60
    assert met[0]["goal"].startswith("conductor >= single:calc")
    zero = own.goal_rows(60, 0, ("single:calc", 0), 0)
    assert [g["met"] for g in zero] == [False, True] and zero[1]["share_of_oracle"] is None


def test_the_answering_worker_is_the_last_top_level_step(tmp_path):
    steps = pa.table({
        "run_id": ["a", "a", "a", "b", "c"], "step": [0, 1, 2, 0, 0],
        "depth": [0, 0, 1, 0, 0], "worker": ["chat", "calc", "poet", "runner", "chat"],
    })  # fmt: skip
    (tmp_path / "steps").mkdir()
    pq.write_table(steps, tmp_path / "steps" / "part.parquet")
    assert own.answering_workers(str(tmp_path), {"a", "b"}) == {"a": "calc", "b": "runner"}


def _fake_eval(home: Path, calls: list):
    """``run_eval`` writing a runs and a steps file per eval: ``calc`` answers arithmetic,
    ``chat`` facts, ``runner`` programs; the conductor routes the same and adds stories."""

    def run_eval(worker, limit, concurrency, seed, *, dataset, strategy=None, extra=()):
        calls.append(strategy or f"single:{worker}")
        test = load_dataset(dataset, split="test", limit=limit)
        eval_id, route = f"e{len(calls)}", worker or None
        runs, steps = [], []
        for i, e in enumerate(test):
            need = own.ROUTES[e.meta["domain"]] if strategy else worker
            if strategy:
                need = "chat" if e.meta["domain"] == "programs" and i % 2 else need
            right = need == own.ROUTES[e.meta["domain"]] and (
                bool(strategy) or e.meta["domain"] in ("facts", "programs", "expressions")
            )
            valid = None if not strategy else i != 0
            runs.append(
                {
                    "run_id": f"{eval_id}-{i}",
                    "question_id": e.id,
                    "correct": right,
                    "format_valid": valid,
                    "tags": [("eval_id", eval_id)],
                }
            )
            steps.append({"run_id": f"{eval_id}-{i}", "step": 0, "depth": 0,
                          "worker": route or need})  # fmt: skip
        for name, table in (("runs", runs), ("steps", steps)):
            (home / name).mkdir(parents=True, exist_ok=True)
            kind = pa.map_(pa.string(), pa.string()) if name == "runs" else None
            schema = None if kind is None else pa.schema([
                ("run_id", pa.string()), ("question_id", pa.string()), ("correct", pa.bool_()),
                ("format_valid", pa.bool_()), ("tags", kind)])  # fmt: skip
            pq.write_table(pa.Table.from_pylist(table, schema=schema),
                           home / name / f"{eval_id}.parquet")  # fmt: skip
        return {"eval_id": eval_id, "artifacts": str(home), "accuracy": 0.0}

    return run_eval


def test_the_measurement_resumes_and_reports_the_goals(tmp_path, monkeypatch):
    """The whole pipeline with the evals and the training faked: every step's result is a
    file, a second run re-runs nothing, and the table and JSON carry the goals."""
    calls: list[str] = []
    artifacts = tmp_path / "artifacts"
    monkeypatch.setattr(own, "run_eval", _fake_eval(artifacts, calls))
    ledger = [{"stage": "collect", "worker_calls": 7},
              {"stage": "total", "worker_calls": 7, "input_tokens": 1, "output_tokens": 2,
               "cost_usd": 0.0, "conductor_generations": 3, "wall_s": 9.0}]  # fmt: skip

    def train(recipe, sets, extra):
        calls.append(f"train {recipe} {sets} {extra[1].endswith('pool.yaml')}")
        return {"recipe": recipe, "run_id": "r", "adapter_uri": "models:/conductor/1",
                "command_wall_s": 600.0, "wall_s": 590.0, "ledger": ledger}  # fmt: skip

    monkeypatch.setattr(own, "run_training", train)
    monkeypatch.setattr(own, "steps_worker_calls", lambda run: 7)
    monkeypatch.setenv("CONDUCTOR_HOME", "set-by-main")  # main sets it; restored after
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--home", str(tmp_path / "dir"), "--set", "seed=1", "--json"]
    assert own.main(argv) == 0
    assert calls == ["single:runner", "single:poet", "single:chat", "single:calc",
                     "train default ['seed=1'] True", "conductor"]  # fmt: skip
    result = json.loads((tmp_path / "dir" / "result.json").read_text())
    assert own.main(argv) == 0 and len(calls) == 6  # resumed: nothing ran twice
    assert result["right"]["oracle router"] == 36 and result["n"] == 60
    assert result["right"]["trained conductor"] == 60 - 6  # programs sent to chat half the time
    assert result["best_single"] == "single:runner"  # 12, tied with chat and calc: first one
    assert [g["met"] for g in result["goals"]] == [True, True]
    assert result["routing"]["programs"] == {"runner": 6, "chat": 6}
    assert result["routing"]["facts"] == {"chat": 11, "invalid": 1}  # the first plan's
    assert result["training"]["steps_worker_calls"] == 7
    text = own.markdown(result)
    assert "| trained conductor |" in text and "| conductor >= single:runner + 15 points" in text
    assert "| 10.0 | 7 | 7 |" in text
    monkeypatch.setattr(own, "run_eval", lambda *a, **k: pytest.fail("ran again"))
    assert own.main([*argv[:4], "--limit-heldout", "60"]) == 0


def test_the_helpers_examples_hold():
    assert doctest.testmod(own).failed == 0
