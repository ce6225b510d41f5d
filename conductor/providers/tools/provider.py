"""The ``tool`` litellm provider (issue #3): tools answer chat completions like a model.

``litellm.completion(model="tool/calculator", messages=...)`` evaluates the arithmetic in the
step's subtask; ``tool/python`` runs the code it finds in the sandbox (isolated, unless the step
task passes the pool's ``sandbox="process"`` as a litellm parameter). Call :func:`register`
once before the first completion (``conductor.providers.llm`` does it for ``tool/...`` models).

Where the input comes from (``conductor.plan.prompts.worker_messages``: the question as a system
turn, each visible step as a user/assistant pair, the subtask as the last user turn):

- calculator: an expression with an operator in the last user message, else in the earlier
  messages from the latest back (a visible step's answer may hold it), else a bare number;
- python: code in the last user message, else in the latest assistant message holding some.

Tools use no tokens: usage is 0/0, priced at 0 by the pool. Failures raise ``ToolError``
(never retryable), which ``conductor.providers.llm.classify_error`` finds under litellm's wrapper.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prefect_conductor.conductor.providers._litellm import fill_response, litellm, register_provider
from prefect_conductor.conductor.providers.tools import ToolError
from prefect_conductor.conductor.providers.tools.calculator import evaluate, extract_expression
from prefect_conductor.conductor.providers.tools.sandbox import (
    SANDBOX_MODES,
    SandboxMode,
    extract_code,
    run_sandboxed,
    show_last_value,
)

__all__ = [
    "PROVIDER",
    "TOOLS",
    "ToolLLM",
    "answer_calculator",
    "answer_python",
    "register",
    "run_tool",
]

PROVIDER = "tool"
PYTHON_TIMEOUT_S = 10.0


def _text(message: dict[str, Any]) -> str:
    """Plain text of a message, joining OpenAI content parts."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _last_user(messages: list[dict[str, Any]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    raise ToolError("tool: the messages hold no user turn (the step's subtask)")


_TEAM = "You are part of a team answering this question:\n"


def _question_expression(messages: list[dict[str, Any]]) -> str | None:
    """The expression of the shared question (``worker_messages``' system turn), if any."""
    for m in messages:
        text = _text(m)
        if m.get("role") == "system" and text.startswith(_TEAM):
            try:
                return extract_expression(text.removeprefix(_TEAM), require_operator=True)
            except ToolError:
                return None
    return None


def _miscopied(expression: str, question: str | None) -> bool:
    """``expression`` is the question's with its brackets moved or dropped: the same numbers
    and operators in the same order, other brackets (``3 + 4 * 5`` for ``(3 + 4) * 5``), a
    different value. A plan that copies an expression must copy it exactly (issue #40)."""
    if question is None or expression == question:
        return False

    def bare(text: str) -> str:
        return "".join(ch for ch in text if ch not in "() \t")

    return bare(expression) == bare(question) and evaluate(expression) != evaluate(question)


def answer_calculator(
    messages: list[dict[str, Any]],
    timeout_s: float | None = None,
    sandbox: SandboxMode = "isolated",
) -> str:
    """Evaluate the expression of the subtask, or of the latest earlier message with one.

    A subtask that copies the question's expression with other brackets is refused (a
    ``ToolError``: the step fails, loudly), never answered: it would be a silent wrong
    answer."""
    last = _last_user(messages)
    order = [messages[last]] + [messages[i] for i in range(len(messages) - 1, -1, -1) if i != last]
    # An expression needs an operator or a function call: a bare number found in prose ("A
    # shop sells 41 stickers ...") is not an answer, so the step fails instead of echoing it.
    for text in (_text(m) for m in order):
        try:
            expression = extract_expression(text, require_operator=True)
        except ToolError:
            continue
        question = _question_expression(messages)
        if _miscopied(expression, question):
            raise ToolError(
                f"calculator: the subtask's expression {expression!r} is the question's "
                f"{question!r} with other brackets; copy the expression exactly"
            )
        return evaluate(expression)
    raise ToolError(
        "calculator: no arithmetic expression in the instruction (numbers joined by operators, "
        "such as '6 * 7', are needed; prose with numbers is not an expression)"
    )


def answer_python(
    messages: list[dict[str, Any]],
    timeout_s: float | None = None,
    sandbox: SandboxMode = "isolated",
) -> str:
    """Run the subtask's code, else the latest visible answer's, else a fenced block of the
    shared question, and report what it printed; a last statement that is an expression has
    its value printed too, as at a Python prompt (:func:`show_last_value`).

    The last fallback lets a plan say "run the program in the question" without copying the
    program into its subtask: issue #18 measured conductor plans cut at their token limit
    before the program was copied. ``sandbox`` is the pool's setting (``isolated`` unless the
    pool says ``process``).
    """
    last = _last_user(messages)
    candidates = [messages[last]] + [
        m for m in reversed(messages[:last]) if m.get("role") == "assistant"
    ]
    shared = [m for m in messages[:last] if m.get("role") == "system" and "```" in _text(m)]
    code = None
    for message in candidates + shared:
        try:
            code = extract_code(_text(message))
            break
        except ToolError:
            continue
    if code is None:
        raise ToolError("python: no code in the instruction, an earlier answer or the question")
    code = show_last_value(code)
    limit = min(PYTHON_TIMEOUT_S, timeout_s) if timeout_s else PYTHON_TIMEOUT_S
    result = run_sandboxed(code, mode=sandbox, timeout_s=limit)
    answer = result.stdout.rstrip("\n")
    if result.timed_out:
        answer += f"\ntimed out after {limit:g}s"
    elif result.returncode != 0:
        answer += f"\nstderr:\n{result.stderr.rstrip()}"
    return answer.strip("\n") or "(no output)"


TOOLS: dict[str, Callable[[list[dict[str, Any]], float | None, SandboxMode], str]] = {
    "calculator": answer_calculator,
    "python": answer_python,
}


def run_tool(
    name: str,
    messages: list[dict[str, Any]],
    timeout_s: float | None = None,
    sandbox: SandboxMode = "isolated",
) -> str:
    """Answer ``messages`` with tool ``name`` (``calculator`` or ``python``)."""
    tool = TOOLS.get(name.removeprefix(f"{PROVIDER}/"))
    if tool is None:
        raise ToolError(f"unknown tool {name!r}; known: {', '.join(f'tool/{t}' for t in TOOLS)}")
    if sandbox not in SANDBOX_MODES:
        raise ToolError(f"tool: sandbox must be one of {', '.join(SANDBOX_MODES)}, got {sandbox!r}")
    return tool(messages, timeout_s, sandbox)


# litellm comes through conductor.providers._litellm only, which configures it before its first
# import (offline price map); a ``from litellm import ...`` here could be that first import.
class ToolLLM(litellm.CustomLLM):
    """litellm handler for ``tool/<name>``; see the module docstring."""

    def completion(
        self,
        model: str,
        messages: list,
        api_base: str,
        custom_prompt_dict: dict,
        model_response: litellm.ModelResponse,
        print_verbose: Callable,
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict,
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict | None = None,
        timeout: Any = None,
        client: Any = None,
    ) -> litellm.ModelResponse:
        name = f"{PROVIDER}/{model.removeprefix(f'{PROVIDER}/')}"
        seconds = float(timeout) if isinstance(timeout, int | float) else None
        # The pool's ``sandbox:`` setting, passed by the step task as a litellm parameter.
        sandbox = (optional_params or {}).get("sandbox", "isolated")
        try:
            text = run_tool(name, messages, seconds, sandbox)
        except ToolError as exc:
            exc.worker = exc.worker or name
            raise
        return fill_response(model_response, text=text, model=name)

    async def acompletion(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> litellm.ModelResponse:
        return await asyncio.to_thread(self.completion, *args, **kwargs)


_handler = ToolLLM()


def register() -> None:
    """Make ``tool/<name>`` models reachable through litellm. Idempotent."""
    register_provider(PROVIDER, _handler)
