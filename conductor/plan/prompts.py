"""The conductor's prompt, in one place, so that inference and GRPO training use the same text.

Follows the Conductor paper (arXiv 2512.04388): workers are shown by ordinal name
("Model 0..k") with the pool file's descriptions, so the conductor cannot favour famous
names; the prompt states the three-list output format and carries four worked examples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from prefect_conductor.conductor.adapters import (
    EMBEDDED_ADAPTER,
    embedded_adapter_path,
    is_adapter_dir,
    read_adapter,
)
from prefect_conductor.conductor.plan.workflow import Workflow
from prefect_conductor.conductor.pool import Pool

__all__ = [
    "FORMAT_RULES",
    "EXAMPLES",
    "PromptStyle",
    "describe_pool",
    "describe_workers",
    "prompt_style",
    "conductor_messages",
    "recursion_messages",
    "render_plan",
    "worker_messages",
]

# "full": rules, the pool and the four worked examples (the paper's prompt, ~690 tokens for
# the local pool). "compact": rules and the pool only (~250 tokens). A trained conductor has
# learnt the format and needs no examples; on a CPU the prompt's length is the main cost of a
# GRPO step and of every plan, so trained adapters use it. Training reads the style from the
# same place serving does (the pool's ``conductor.prompt``), so the two never drift.
PromptStyle = Literal["full", "compact"]

FORMAT_RULES = """\
You are the Conductor. You do not answer the question yourself: you write a workflow that
a team of models will run. First think briefly about how to split the work. Then write
exactly three Python lists, each on its own line:

model_id = [...]     # for each step, the number of the model that runs it
subtasks = [...]     # for each step, a clear instruction for that model
access_list = [...]  # for each step, the earlier steps it may read: a list of step
                     # numbers, "all" for every earlier step, or [] for none

Rules:
- Between 1 and {max_steps} steps. The three lists have the same length.
- Steps are numbered from 0. A step may only read earlier steps.
- Steps that do not read each other run in parallel.
- The output of the last step is the final answer, so the last step must state it.
"""

# Four worked examples (the paper's prompt carries four). Model numbers refer to a pool of
# three models; they show the shapes: one step, a chain, a fan-out with a join, a check.
EXAMPLES: tuple[tuple[str, str], ...] = (
    (
        "What is the capital of France?",
        "This is a simple fact; one model can answer it.\n"
        "model_id = [0]\n"
        'subtasks = ["Answer the question: what is the capital of France? Reply with the city."]\n'
        "access_list = [[]]",
    ),
    (
        "A train travels 120 km in 1.5 hours. What is its average speed in km/h?",
        "One model sets up the computation, a second checks it and states the answer.\n"
        "model_id = [1, 0]\n"
        'subtasks = ["Compute 120 / 1.5 step by step.", '
        '"Check the computation above and state the final speed in km/h."]\n'
        "access_list = [[], [0]]",
    ),
    (
        "Which is larger: 2^10 or 10^3? Explain briefly.",
        "Two models compute each power independently; a third compares.\n"
        "model_id = [1, 1, 0]\n"
        'subtasks = ["Compute 2^10.", "Compute 10^3.", '
        '"Compare the two results and say which is larger, with the numbers."]\n'
        'access_list = [[], [], "all"]',
    ),
    (
        "Write a Python function is_even(n) that returns True for even integers.",
        "One model writes the code, another reviews it, the first fixes it if needed.\n"
        "model_id = [2, 0, 2]\n"
        'subtasks = ["Write the function is_even(n).", '
        '"Review this function for bugs and edge cases such as negative numbers.", '
        '"Give the final corrected function only."]\n'
        "access_list = [[], [0], [0, 1]]",
    ),
)


def describe_pool(pool: Pool) -> str:
    """Workers by ordinal name plus their descriptions; model names are never shown."""
    lines = []
    for i, w in enumerate(pool.workers):
        desc = w.description.strip() or (
            "a planner like you" if w.kind == "conductor" else "a model"
        )
        lines.append(f"Model {i}: {desc}")
    return "\n".join(lines)


def describe_workers(pool: Pool) -> str:
    """Workers by name with their descriptions, one per line: what OrchRM reads with a plan.

    Unlike :func:`describe_pool` the names are shown, because OrchRM's plan documents name
    their workers (``prefect_conductor.reward_model.documents.plan_document``).
    """
    return "\n".join(f"{w.name}: {' '.join(w.description.split()) or w.kind}" for w in pool.workers)


def prompt_style(pool: Pool) -> PromptStyle:
    """The pool's ``conductor.prompt``; unset, the style a trained adapter was trained with
    (``local/<adapter dir>``, ``local/smollm2-135m-conductor``), else ``full``."""
    if pool.conductor.prompt is not None:
        return pool.conductor.prompt
    model = pool.conductor.model
    if model.startswith("local/"):
        name = model.removeprefix("local/")
        path = embedded_adapter_path() if name == EMBEDDED_ADAPTER else Path(name).expanduser()
        if is_adapter_dir(path):
            return read_adapter(path).prompt  # type: ignore[return-value]
    return "full"


def _system(pool: Pool, max_steps: int | None) -> str:
    rules = FORMAT_RULES.format(max_steps=max_steps or pool.max_steps)
    note = pool.conductor.hint.note.strip() if pool.conductor.hint else ""
    hint = f"\n\n{note}" if note else ""
    if prompt_style(pool) == "compact":
        return f"{rules}\nYour models:\n{describe_pool(pool)}{hint}"
    shots = "\n\n".join(f"Question: {q}\n{a}" for q, a in EXAMPLES)
    return (
        f"{rules}\nYour models:\n{describe_pool(pool)}\n\n"
        f"Examples (for a different pool):\n\n{shots}{hint}"
    )


def conductor_messages(
    question: str, pool: Pool, max_steps: int | None = None
) -> list[dict[str, str]]:
    """Chat messages that ask the conductor for a plan for ``question``; the worked examples
    of the pool's hint (``hint.shots``) come first as earlier turns of the conversation."""
    shots = pool.conductor.hint.shots if pool.conductor.hint else ()
    turns = [
        turn
        for shot in shots
        for turn in (
            {"role": "user", "content": f"Question: {shot.question}"},
            {"role": "assistant", "content": shot.plan},
        )
    ]
    return [
        {"role": "system", "content": _system(pool, max_steps)},
        *turns,
        {"role": "user", "content": f"Question: {question}"},
    ]


def render_plan(workflow: Workflow, pool: Pool) -> str:
    """A plan as the conductor writes it: one line of reasoning, then the three lists.

    Workers become their ordinal "Model k" numbers in ``pool``; the lists are JSON literals,
    which the parser reads with ``ast.literal_eval``. Used to render warm-start targets.

    >>> from prefect_conductor.conductor.pool import load_pool
    >>> print(render_plan(Workflow.single_step("calculator", "17 + 25"), load_pool()))
    One step is enough: Model 1 does it.
    model_id = [1]
    subtasks = ["17 + 25"]
    access_list = [[]]
    """
    ids = [pool.index_of(s.worker) for s in workflow.steps]
    if len(ids) == 1:
        why = f"One step is enough: Model {ids[0]} does it."
    else:
        chain = ", then ".join(f"Model {i}" for i in ids)
        why = f"{len(ids)} steps: {chain}; the last one states the answer."
    lists = workflow.to_lists()
    return (
        f"{why}\nmodel_id = {json.dumps(ids)}\n"
        f"subtasks = {json.dumps(lists['subtasks'], ensure_ascii=False)}\n"
        f"access_list = {json.dumps(lists['access_list'])}"
    )


def recursion_messages(
    question: str,
    pool: Pool,
    parent: Workflow,
    instruction: str,
    last_response: str | None,
    max_steps: int | None = None,
) -> list[dict[str, str]]:
    """A nested planning round (paper's recursion): refine, or accept with three empty lists."""
    lists = parent.to_lists()
    shown = last_response if last_response is not None else "(no response yet)"
    return [
        {"role": "system", "content": _system(pool, max_steps)},
        {
            "role": "user",
            "content": (
                f"Question: {question}\n\n"
                f"An earlier workflow was:\nmodel_id = {lists['model_id']!r}\n"
                f"subtasks = {lists['subtasks']!r}\naccess_list = {lists['access_list']!r}\n\n"
                f"Its latest response:\n{shown}\n\n"
                f"Your task: {instruction}\n"
                "If the response is already correct and complete, accept it by writing\n"
                "model_id = []\nsubtasks = []\naccess_list = []\n"
                "Otherwise write a new workflow that improves it."
            ),
        },
    ]


def worker_messages(
    question: str,
    instruction: str,
    visible: list[tuple[str, str]],
    share_question: bool = True,
    system: str | None = None,
) -> list[dict[str, str]]:
    """What a worker sees (paper §3): the question, each visible step as a (subtask,
    response) pair of turns, then its own subtask as the last user turn. ``system`` is the
    worker's own system prompt (``WorkerSpec.system``), first when given."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    if share_question and instruction.strip() != question.strip():
        messages.append(
            {
                "role": "system",
                "content": f"You are part of a team answering this question:\n{question}",
            }
        )
    for subtask, response in visible:
        messages.append({"role": "user", "content": subtask})
        messages.append({"role": "assistant", "content": response})
    messages.append({"role": "user", "content": instruction})
    return messages
