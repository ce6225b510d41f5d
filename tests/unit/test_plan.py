"""Unit tests for prefect_conductor.conductor.plan.parse: finding, parsing and validating the conductor's plan."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import random

import prefect_conductor.conductor.plan.parse as plan_mod
import pytest
from prefect_conductor.conductor.errors import PlanError
from prefect_conductor.conductor.plan.parse import (
    MAX_INSTRUCTION_CHARS,
    MAX_PLAN_TEXT_CHARS,
    RawPlan,
    extract_plan,
    parse_plan,
    validate_plan,
)
from prefect_conductor.conductor.pool import Pool, pool_from_dict


@pytest.fixture(scope="module")
def pool() -> Pool:
    return pool_from_dict(
        {
            "conductor": {"model": "local/tiny"},
            "workers": [
                {"name": "a", "model": "local/a"},
                {"name": "b", "model": "local/b"},
                {"name": "meta", "kind": "conductor"},
            ],
        }
    )


def lists(workers: list, subtasks: list, access: list) -> str:
    """The paper's three assignments, written as the conductor writes them."""
    return f"model_id = {workers!r}\nsubtasks = {subtasks!r}\naccess_list = {access!r}\n"


def as_json(steps: list[dict]) -> str:
    return json.dumps({"steps": steps})


PAPER = lists([0, 1], ["Solve the equation.", "Check the solution."], [[], [0]])
PAPER_WANT = (["a", "b"], ["Solve the equation.", "Check the solution."], [[], [0]])

# (id, conductor output, expected (workers, instructions, access) after validation)
VALID = [
    (
        "paper-format-after-reasoning",
        "The question is algebra. Model 0 is strong at maths, so it solves; Model 1 checks.\n"
        + PAPER,
        PAPER_WANT,
    ),
    ("python-fence", f"Plan:\n```python\n{PAPER}```\nDone.", PAPER_WANT),
    ("bare-fence", f"```\n{PAPER}```", PAPER_WANT),
    (
        "json-fence",
        "```json\n"
        + as_json(
            [
                {"worker": 0, "instruction": "Solve the equation.", "access": []},
                {"worker": "b", "instruction": "Check the solution.", "access": [0]},
            ]
        )
        + "\n```",
        PAPER_WANT,
    ),
    (
        "json-access-defaults-to-empty",
        as_json([{"worker": 1, "instruction": "Answer."}]),
        (["b"], ["Answer."], [[]]),
    ),
    (
        "repeated-lists-last-wins",
        lists([0], ["First try."], [[]]) + "Wait, better:\n" + PAPER,
        PAPER_WANT,
    ),
    (
        "lists-then-json-json-wins",
        lists([0], ["First try."], [[]])
        + as_json([{"worker": "b", "instruction": "Second.", "access": "all"}]),
        (["b"], ["Second."], [[]]),
    ),
    (
        "json-then-lists-lists-win",
        as_json([{"worker": "b", "instruction": "First.", "access": []}]) + "\n" + PAPER,
        PAPER_WANT,
    ),
    (
        "later-incomplete-plan-ignored",
        PAPER + "\nOr maybe model_id = [1, 1] and subtasks = ['x', 'y'] ... no.",
        PAPER_WANT,
    ),
    (
        "draft-model_id-in-reasoning",
        "I could set model_id = [2] but that recurses.\n" + PAPER,
        PAPER_WANT,
    ),
    (
        # Found by tests/unit/test_fuzz.py: the stray list completed a plan with the real
        # model_id and subtasks, and the real access_list was left over.
        "stray-access_list-in-reasoning",
        "One step would have access_list = [[]], but a check helps.\n" + PAPER,
        PAPER_WANT,
    ),
    (
        "stray-access_list-then-plan-then-truncated-repeat",
        "access_list = [[]] is too little.\n" + PAPER + "\nmodel_id = [1, 1]\nsubtasks = ['x'",
        PAPER_WANT,
    ),
    (
        "any-order",
        "access_list = [[], [0]]\nsubtasks = ['Solve the equation.', 'Check the solution.']\n"
        "model_id = [0, 1]",
        PAPER_WANT,
    ),
    (
        "names-and-indices-and-Model-N",
        lists(["a", 1, "Model 0"], ["x", "y", "z"], [[], [], []]),
        (["a", "b", "a"], ["x", "y", "z"], [[], [], []]),
    ),
    (
        "all-expands-and-dupes-removed",
        lists([0, 1, 0, 1], ["s0", "s1", "s2", "s3"], [[], "all", [1, 0, 1, 0], "ALL"]),
        (["a", "b", "a", "b"], ["s0", "s1", "s2", "s3"], [[], [0], [0, 1], [0, 1, 2]]),
    ),
    (
        "brackets-quotes-and-comments-inside-literals",
        'model_id = [0,  # the solver ] "\n 1]\n'
        "subtasks = [\"Don't stop ] at ')' or model_id = [9]\", '''Say \"hi\" [twice]''']\n"
        "access_list = [[], [0]]",
        (
            ["a", "b"],
            ["Don't stop ] at ')' or model_id = [9]", 'Say "hi" [twice]'],
            [[], [0]],
        ),
    ),
    (
        "escaped-quotes",
        "model_id = [0]\nsubtasks = ['It\\'s a \\\\ test']\naccess_list = [[]]",
        (["a"], ["It's a \\ test"], [[]]),
    ),
    (
        "instructions-stripped",
        lists([0], ["  padded \n"], [[]]),
        (["a"], ["padded"], [[]]),
    ),
    (
        "unicode-instructions",
        lists([0, 1], ["Résous ∫x dx 🙂", "检查答案"], [[], "all"]),
        (["a", "b"], ["Résous ∫x dx 🙂", "检查答案"], [[], [0]]),
    ),
    (
        "comparison-is-not-an-assignment",
        "if model_id == [3] we fail.\n" + PAPER,
        PAPER_WANT,
    ),
    ("nul-bytes-in-reasoning-only", "thinking\x00\x00 aloud\n" + PAPER, PAPER_WANT),
    (
        "conductor-worker-allowed-by-default",
        lists([2], ["Refine the plan."], [[]]),
        (["meta"], ["Refine the plan."], [[]]),
    ),
    (
        "unclosed-draft-then-plan",
        "Maybe model_id = [0, 1 (don't know yet)\nFinal answer:\n" + PAPER,
        PAPER_WANT,
    ),
    (
        "json-with-Model-N-and-all",
        as_json(
            [
                {"worker": "Model 1", "instruction": "Draft.", "access": []},
                {"worker": "a", "instruction": "Polish.", "access": "all"},
            ]
        ),
        (["b", "a"], ["Draft.", "Polish."], [[], [0]]),
    ),
]


@pytest.mark.parametrize(("text", "want"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_plans(text: str, want: tuple, pool: Pool) -> None:
    wf = parse_plan(text, pool)
    assert [s.worker for s in wf.steps] == want[0]
    assert [s.instruction for s in wf.steps] == want[1]
    assert [list(s.access) for s in wf.steps] == want[2]
    assert [s.index for s in wf.steps] == list(range(len(want[0])))


def _steps(n: int) -> tuple[list, list, list]:
    return [0] * n, [f"step {i}" for i in range(n)], [[] for _ in range(n)]


# (id, conductor output, exact PlanError message)
INVALID = [
    (
        "lengths-differ",
        lists([0, 1, 0], ["x", "y"], [[], [], []]),
        "model_id, subtasks and access_list have different lengths (3, 2, 3)",
    ),
    ("no-steps", lists([], [], []), "plan has no steps"),
    ("no-steps-json", as_json([]), "plan has no steps"),
    ("too-many-steps", lists(*_steps(7)), "plan has 7 steps; at most 5 are allowed"),
    (
        "worker-index-out-of-range",
        lists([0, 9], ["x", "y"], [[], []]),
        "step 1: worker 9 does not exist; the pool has Model 0..2",
    ),
    (
        "worker-index-negative",
        lists([-1], ["x"], [[]]),
        "step 0: worker -1 does not exist; the pool has Model 0..2",
    ),
    (
        "Model-N-out-of-range",
        lists(["Model 7"], ["x"], [[]]),
        "step 0: worker 7 does not exist; the pool has Model 0..2",
    ),
    (
        "unknown-worker-name",
        lists(["gpt9"], ["x"], [[]]),
        "step 0: unknown worker 'gpt9'; known: a, b, meta",
    ),
    (
        "bool-is-not-a-worker-index",
        lists([True], ["x"], [[]]),
        "step 0: worker must be a model index (int) or a worker name (str), got True",
    ),
    (
        "nested-list-worker",
        lists([[0]], ["x"], [[]]),
        "step 0: worker must be a model index (int) or a worker name (str), got [0]",
    ),
    (
        "float-worker",
        lists([1.0], ["x"], [[]]),
        "step 0: worker must be a model index (int) or a worker name (str), got 1.0",
    ),
    (
        "none-worker",
        as_json([{"worker": None, "instruction": "x"}]),
        "step 0: worker must be a model index (int) or a worker name (str), got None",
    ),
    (
        "huge-int-worker-message-shortened",
        lists([10**200], ["x"], [[]]),
        f"step 0: worker {repr(10**200)[:57]}... does not exist; the pool has Model 0..2",
    ),
    (
        "reads-later-step",
        lists(*_steps(5)[:2], [[], [], [], [4], []]),
        "step 3 reads step 4, which runs later",
    ),
    (
        "reads-itself",
        lists([0, 1, 0], ["x", "y", "z"], [[], [0], [2]]),
        "step 2 reads itself",
    ),
    (
        "reads-missing-step",
        lists([0, 1], ["x", "y"], [[], [7]]),
        "step 1 reads step 7, which does not exist",
    ),
    (
        "reads-negative-step",
        lists([0, 1], ["x", "y"], [[], [-1]]),
        "step 1 reads step -1, which does not exist",
    ),
    (
        "cycle-is-named",
        lists([0, 1], ["x", "y"], [[1], [0]]),
        "access lists form a cycle: step 0 reads step 1 reads step 0",
    ),
    (
        "three-step-cycle-is-named",
        lists([0, 1, 0], ["x", "y", "z"], [[2], [0], [1]]),
        "access lists form a cycle: step 0 reads step 2 reads step 1 reads step 0",
    ),
    (
        "access-not-a-list",
        lists([0, 1], ["x", "y"], [[], "x"]),
        "step 1: access must be a list of step indices, \"all\" or [], got 'x'",
    ),
    (
        "access-bool",
        lists([0, 1], ["x", "y"], [[], [True]]),
        'step 1: access must be a list of step indices, "all" or [], got [True]',
    ),
    (
        "access-float",
        lists([0, 1], ["x", "y"], [[], [0.0]]),
        'step 1: access must be a list of step indices, "all" or [], got [0.0]',
    ),
    (
        "access-int-not-list",
        lists([0, 1], ["x", "y"], [[], 0]),
        'step 1: access must be a list of step indices, "all" or [], got 0',
    ),
    ("instruction-empty", lists([0], [""], [[]]), "step 0: instruction is empty"),
    ("instruction-blank", lists([0], [" \n\t "], [[]]), "step 0: instruction is empty"),
    (
        "instruction-too-long",
        lists([0], ["x" * 9000], [[]]),
        f"step 0: instruction is 9000 characters; at most {MAX_INSTRUCTION_CHARS}",
    ),
    (
        "instruction-not-a-string",
        lists([0, 1], ["x", 5], [[], []]),
        "step 1: instruction must be a string, got 5",
    ),
    (
        "instruction-is-a-list",
        lists([0], [["x"]], [[]]),
        "step 0: instruction must be a string, got ['x']",
    ),
    (
        "instruction-with-nul",
        "model_id = [0]\nsubtasks = ['a\\x00b']\naccess_list = [[]]",
        "step 0: instruction contains a NUL character",
    ),
    (
        "json-step-not-object",
        as_json(["x"]),
        "step 0: a JSON step must be an object, got str",
    ),
    (
        "json-step-missing-instruction",
        as_json([{"worker": 0}]),
        'step 0: the JSON step has no "instruction"',
    ),
    (
        "json-steps-not-a-list",
        '{"steps": {"worker": 0}}',
        'the JSON plan\'s "steps" must be a list, got dict',
    ),
    (
        "nothing-at-all",
        "I think the answer is 42.",
        "no plan found: expected model_id = [...], subtasks = [...], access_list = [...] "
        'or a JSON {"steps": [...]}',
    ),
    (
        "empty-text",
        "",
        "no plan found: expected model_id = [...], subtasks = [...], access_list = [...] "
        'or a JSON {"steps": [...]}',
    ),
    (
        "call-instead-of-list",
        "model_id = __import__('os').system('x')",
        "no complete plan found: model_id = \"__import__('os').system('x')\" is not a list literal",
    ),
    (
        "unclosed-list",
        "model_id = [0, 1\nsubtasks = ['a', 'b']\naccess_list = [[], [0]]",
        "no complete plan found: model_id: '[' at line 1 is never closed",
    ),
    (
        "mismatched-bracket",
        "model_id = [0, 1)\nsubtasks = ['a', 'b']\naccess_list = [[], [0]]",
        "no complete plan found: model_id: '[' at line 1 is closed by ')' at line 1",
    ),
    (
        "unterminated-string",
        "model_id = [0]\nsubtasks = ['abc]\naccess_list = [[]]",
        "no complete plan found: subtasks: the string at line 2 is never closed",
    ),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_plans_have_precise_messages(text: str, message: str, pool: Pool) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan(text, pool)
    assert str(info.value) == message


def _deep(n: int) -> str:
    return "[" * n + "]" * n


_RNG = random.Random(0)
_TAIL = "\nsubtasks = ['x']\naccess_list = [[]]"

# (id, hostile conductor output, a fragment the PlanError message must contain)
HOSTILE = [
    ("deep-nesting-50k", "model_id = " + _deep(50_000), "nest more than 32 deep"),
    ("deep-nesting-100k", "model_id = " + _deep(100_000), "characters; at most"),
    ("deep-json", '{"steps": ' + _deep(50_000) + "}", "nest more than 32 deep"),
    ("deep-nesting-33", "model_id = " + _deep(33) + _TAIL, "nest more than 32 deep"),
    ("deep-parens-inside-list", "model_id = [" + "(" * 5000 + "0" + ")" * 5000 + "]", "32 deep"),
    ("huge-text", "x" * (MAX_PLAN_TEXT_CHARS + 1), "characters; at most 200000"),
    ("huge-string-literal", lists([0], ["y" * 199_000], [[]]), "characters; at most"),
    ("binary-latin1", bytes(range(256)).decode("latin-1") * 200, "no plan found"),
    ("random-bytes", _RNG.randbytes(100_000).decode("latin-1"), "plan"),
    ("binary-after-model_id", "model_id = [" + bytes(range(256)).decode("latin-1"), "model_id"),
    ("import-in-list", "model_id = [__import__('os').system('x')]" + _TAIL, "not a Python literal"),
    ("name-in-list", "model_id = [os]" + _TAIL, "not a Python literal: malformed node"),
    ("power-expression", "model_id = [10**100000]" + _TAIL, "not a Python literal"),
    ("100k-digits", "model_id = [1" + "0" * 100_000 + "]" + _TAIL, "too big for a plan"),
    ("5k-digits", "model_id = [1" + "0" * 5000 + "]" + _TAIL, "not a Python literal: Exceeds"),
    ("unary-chain", "model_id = [" + "-" * 7900 + "1]" + _TAIL, "nested too deeply"),
    ("binop-chain", "model_id = [" + "+".join(["1"] * 3900) + "]" + _TAIL, "nested too deeply"),
    ("long-binop-chain", "model_id = [" + "+".join(["1"] * 60_000) + "]" + _TAIL, "too big"),
    ("not-chain", "model_id = [" + "not " * 1900 + "1]" + _TAIL, "malformed node or string"),
    (
        "many-strings",
        "model_id = [0]\naccess_list = [[]]\nsubtasks = [" + "'a'" * 1001 + "]",
        "1001 strings",
    ),
    ("raw-nul-in-literal", "model_id = [0\x00]" + _TAIL, "not a Python literal"),
    ("lone-surrogate", "model_id = ['\ud800']" + _TAIL, "not a Python literal"),
    ("smart-quotes", "model_id = [0]\nsubtasks = [“x”]\naccess_list = [[]]", "literal"),
    ("set-literal", "model_id = [{0}]" + _TAIL, "worker must be"),
    ("dict-worker", "model_id = [{'a': 1}]" + _TAIL, "worker must be"),
    ("bytes-instruction", "model_id = [0]\nsubtasks = [b'x']\naccess_list = [[]]", "string"),
    ("many-unclosed-candidates", "model_id = [ '''" * 10_000, "32 deep"),
    ("many-open-strings", "model_id = [ '" * 14_000, "32 deep"),
    ("many-open-brackets", "model_id = [\n" * 15_000, "32 deep"),
    ("many-complete-fragments", "model_id = [0]\n" * 13_000, "no plan found"),
    ("alternating-quotes", "model_id = [\"'" * 60_000, "plan"),
    ("many-json-starts", '{"steps": [' * 15_000, "32 deep"),
    ("brackets-galore", "model_id = [" + "[]" * 99_000 + _TAIL, "plan"),
    ("quotes-galore", "model_id = [" + "'', " * 49_000 + "0]" + _TAIL, "too big for a plan"),
    # Each candidate sits inside the previous one's string or comment, so none is memoised:
    # without the scan budget every one of them would rescan the rest of the text.
    ("rescan-escaped-triple", "model_id = [ \\'''" * 11_000, "too tangled"),
    ("rescan-escaped-quote", "model_id = [ \\'" * 13_000, "too tangled"),
    ("rescan-comment", "model_id = [ #" * 14_000, "too tangled"),
    ("comment-swallows-close", "model_id = [0 # ]\n" + _TAIL, "never closed"),
    ("json-trailing-comma", '{"steps": [{"worker": 0, "instruction": "x",}]}', "not valid JSON"),
    ("json-single-quotes", "{\"steps\": [{'worker': 0}]}", "not valid JSON"),
    ("json-huge-int", '{"steps": [{"worker": 1' + "0" * 50_000 + ', "instruction": "x"}]}', "JSON"),
]


@pytest.mark.parametrize(
    ("text", "fragment"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE]
)
def test_hostile_output_fails_cleanly(text: str, fragment: str, pool: Pool) -> None:
    # pytest.raises(PlanError) lets RecursionError, MemoryError, ValueError or SyntaxError
    # through as failures: the parser must turn every one of them into a PlanError.
    with pytest.raises(PlanError) as info:
        parse_plan(text, pool)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 400


def test_non_string_text_is_refused(pool: Pool) -> None:
    with pytest.raises(PlanError, match="plan text must be a string, got bytes"):
        parse_plan(PAPER.encode(), pool)  # type: ignore[arg-type]


def test_literal_code_never_runs(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd) or 0)
    text = "model_id = [__import__('os').system('touch /tmp/pwned')]" + _TAIL
    with pytest.raises(PlanError, match="model_id is not a Python literal"):
        parse_plan(text, pool)
    assert calls == []


def test_module_never_calls_eval_or_exec() -> None:
    tree = ast.parse(inspect.getsource(plan_mod))
    called = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert not called & {"eval", "exec", "compile"}


def test_text_at_the_cap_is_read(pool: Pool) -> None:
    text = " " * (MAX_PLAN_TEXT_CHARS - len(PAPER)) + PAPER
    assert len(text) == MAX_PLAN_TEXT_CHARS
    assert len(parse_plan(text, pool).steps) == 2


def test_conductor_worker_refused_at_depth_cap(pool: Pool) -> None:
    text = lists([0, 1, "meta"], ["x", "y", "z"], [[], [], "all"])
    with pytest.raises(PlanError) as info:
        parse_plan(text, pool, allow_conductor=False)
    assert str(info.value) == (
        "step 2 uses conductor worker 'meta', but the recursion depth cap is reached"
    )
    assert parse_plan(text, pool).final.worker == "meta"


def test_max_steps_overrides_pool(pool: Pool) -> None:
    text = lists(*_steps(3))
    assert len(parse_plan(text, pool).steps) == 3
    with pytest.raises(PlanError, match=r"^plan has 3 steps; at most 2 are allowed$"):
        parse_plan(text, pool, max_steps=2)
    assert len(parse_plan(lists(*_steps(7)), pool, max_steps=7).steps) == 7


def test_extract_keeps_raw_items() -> None:
    raw = extract_plan("reasoning\n" + lists([0, "b", True], ["x", 5, ""], [[], "all", [9]]))
    assert raw == RawPlan(workers=(0, "b", True), subtasks=("x", 5, ""), access=([], "all", [9]))
    assert not raw.is_empty
    with pytest.raises(dataclasses.FrozenInstanceError):
        raw.workers = ()  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        lists([], [], []),
        "```python\nmodel_id = []\nsubtasks = []\naccess_list = []\n```",
        '{"steps": []}',
    ],
)
def test_three_empty_lists_are_the_accept_signal(text: str) -> None:
    assert extract_plan(text).is_empty


def test_validate_plan_directly(pool: Pool) -> None:
    raw = RawPlan(workers=("b", 0), subtasks=("Draft.", "Polish."), access=((), (0, 0)))
    wf = validate_plan(raw, pool)
    assert wf.to_lists() == {
        "model_id": ["b", "a"],
        "subtasks": ["Draft.", "Polish."],
        "access_list": [[], [0]],
    }
    assert wf.layers() == [[0], [1]]


def test_independent_steps_form_one_layer(pool: Pool) -> None:
    text = lists([0, 1, 0], ["Solve.", "Solve too.", "Pick the better."], [[], [], "all"])
    assert parse_plan(text, pool).layers() == [[0, 1], [2]]


def test_single_worker_pool_message() -> None:
    solo = pool_from_dict({"conductor": {"model": "m"}, "workers": [{"name": "s", "model": "m"}]})
    with pytest.raises(PlanError, match=r"^step 0: worker 1 does not exist; the pool has Model 0$"):
        parse_plan(lists([1], ["x"], [[]]), solo)


def test_memoised_scanner_agrees_with_fresh_scans() -> None:
    # The scanner reuses what earlier scans learnt about inner brackets; it must give the
    # same answer as a scanner that starts from nothing, in whatever order it is asked.
    rng = random.Random(7)
    tokens = ["[", "]", "(", ")", "{", "}", "'", '"', "'''", '"""', "#", "\n", "\\", "a", ","]

    def outcome(scanner: plan_mod._Scanner, pos: int) -> int | str:
        try:
            return scanner.end_of(pos)
        except plan_mod._Unclosed:
            return "unclosed"
        except PlanError:
            return "too deep"

    for _ in range(1500):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(1, 50)))
        opens = [i for i, c in enumerate(text) if c in "[({"]
        fresh = {p: outcome(plan_mod._Scanner(text), p) for p in opens}
        shared = plan_mod._Scanner(text)
        for p in rng.sample(opens, len(opens)):
            assert outcome(shared, p) == fresh[p], (text, p)


def test_benchmark_sized_plan_with_explicit_access(pool: Pool) -> None:
    # Pools allow up to 128 steps for benchmarks; the size caps must not refuse such a plan.
    n = 128
    access = [list(range(i)) for i in range(n)]
    wf = parse_plan(
        lists([i % 2 for i in range(n)], [f"part {i}" for i in range(n)], access), pool, max_steps=n
    )
    assert len(wf.steps) == n and wf.final.access == tuple(range(n - 1))
