"""The pool file: the workers a conductor may use, plus the conductor's own model.

A pool is YAML validated by pydantic. Every error names the file and the field, e.g.
``pool.yaml: workers[1].model: field required``. Secrets never live in the file: a worker
names an environment variable (``api_key_env``) or a Prefect Secret block
(``api_key_secret``) instead, and a literal ``api_key`` is refused.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from prefect_conductor.conductor.errors import PoolConfigError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

__all__ = [
    "write_pool_file",
    "ConductorHint",
    "ConductorSpec",
    "Shot",
    "WorkerSpec",
    "Pool",
    "load_pool",
    "default_pool_path",
]

# Keys that would put a secret into the pool file (and from there into Prefect parameters,
# artifacts or MLflow). Refused everywhere in the file.
_SECRET_KEYS = {"api_key", "api_secret", "token", "password", "authorization"}


def _refuse_secrets(params: dict[str, Any]) -> dict[str, Any]:
    bad = sorted(k for k in params if k.lower() in _SECRET_KEYS)
    if bad:
        raise ValueError(
            f"{bad[0]!r} must not be written in the pool file; "
            "set api_key_env (an environment variable) or api_key_secret (a Prefect Secret block)"
        )
    return params


class _Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="litellm model string, e.g. openai/gpt-4o-mini.")
    params: dict[str, Any] = Field(
        default_factory=dict, description="Sampling parameters passed to litellm."
    )
    api_base: str | None = Field(default=None, description="Base URL of the server.")
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the API key."
    )
    api_key_secret: str | None = Field(
        default=None, description="Prefect Secret block with the API key."
    )
    timeout_s: float = Field(default=120.0, gt=0, description="Per-call timeout in seconds.")
    retries: int = Field(default=2, ge=0, le=10, description="Retries on retryable errors.")
    retry_backoff_s: float = Field(
        default=1.0, ge=0, description="First retry delay; doubles on each retry."
    )
    input_cost_per_token: float | None = Field(
        default=None, ge=0, description="USD; overrides litellm's price map."
    )
    output_cost_per_token: float | None = Field(
        default=None, ge=0, description="USD; overrides litellm's price map."
    )

    _check_params = field_validator("params")(classmethod(lambda cls, v: _refuse_secrets(v)))


class Shot(BaseModel):
    """A worked example the conductor reads as an earlier turn of its conversation: the
    question, then the plan as the conductor writes it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    question: str = Field(min_length=1, max_length=4000)
    plan: str = Field(min_length=1, max_length=4000)


class ConductorHint(BaseModel):
    """What a conductor reads besides its question: ``note`` at the end of its instructions
    and ``shots``, worked examples as earlier turns (user: the question; assistant: the
    plan). A plain string is a note."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    note: str = Field(default="", max_length=20_000)
    shots: tuple[Shot, ...] = Field(default=(), max_length=16)

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        return {"note": data} if isinstance(data, str) else data


class ConductorSpec(_Endpoint):
    """The model that writes plans."""

    max_depth: int = Field(default=1, ge=0, le=3, description="Recursion depth cap.")
    prompt: Literal["full", "compact"] | None = Field(
        default=None,
        description="full: rules, pool and four worked examples; compact: rules and pool only "
        "(for trained conductors, which learnt the format). Default: what a trained adapter "
        "was trained with, else full.",
    )
    hint: ConductorHint | None = Field(
        default=None,
        description="What the conductor reads besides its question: a text at the end of its "
        "instructions (a plain string is that note), and worked examples as earlier turns "
        "(what a recipe's self-sampling hints give the sampling conductor).",
    )


class WorkerSpec(_Endpoint):
    """One worker of the pool."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    kind: Literal["llm", "tool", "conductor"] = "llm"
    model: str = Field(default="", description="litellm model string; unused for kind conductor.")
    description: str = Field(default="", max_length=2000)
    subtask: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="The subtask of this worker's one-step plan (`single:WORKER`) when the pool "
        "shares the question, e.g. 'Run the program in the question.'; empty: the question "
        "itself. A short subtask is also what a conductor learns from those runs, instead of "
        "copying the question (issue #18).",
    )
    system: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="A system prompt this llm worker gets before everything else of its step, "
        "e.g. 'Answer in English.' (the embedded `smol`: without it SmolLM2-135M answers "
        "'What is the capital city of France?' in French; issue #18).",
    )
    fallbacks: tuple[str, ...] = Field(default=(), description="Other workers to try, in order.")
    cache: bool = Field(default=False, description="Cache calls at temperature 0.")

    @model_validator(mode="after")
    def _model_required(self) -> WorkerSpec:
        if self.kind != "conductor" and not self.model:
            raise ValueError(f"worker {self.name!r} of kind {self.kind!r} needs a model")
        if self.system is not None and self.kind != "llm":
            raise ValueError(
                f"worker {self.name!r}: `system` is for llm workers; a {self.kind} worker reads "
                "only its subtask and the steps it sees"
            )
        return self

    @property
    def temperature(self) -> float | None:
        t = self.params.get("temperature")
        return float(t) if isinstance(t, (int, float)) else None


class Pool(BaseModel):
    """Validated pool. Workers are shown to the conductor as Model 0..k, in file order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conductor: ConductorSpec
    workers: tuple[WorkerSpec, ...] = Field(min_length=1)
    default_worker: str | None = None
    max_steps: int = Field(default=5, ge=1, le=128)
    share_question: bool = True
    sandbox: Literal["isolated", "process"] = Field(
        default="isolated",
        description="How the python tool runs model-written code. isolated: kernel namespaces "
        "(no network, no other process, nothing of the host writable; fails closed where they "
        "are unavailable). process: rlimits only, as the calling user; every run logs a warning "
        "and the step records it (issue #17).",
    )
    source: str = Field(default="<memory>", exclude=True, description="Where the pool came from.")

    @model_validator(mode="after")
    def _cross_check(self) -> Pool:
        names = [w.name for w in self.workers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"worker name {dupes[0]!r} is used twice")
        if self.default_worker is not None and self.default_worker not in names:
            raise ValueError(
                f"default_worker {self.default_worker!r} is not a worker; known: {', '.join(names)}"
            )
        for w in self.workers:
            for fb in w.fallbacks:
                if fb not in names:
                    raise ValueError(f"worker {w.name!r} falls back to unknown worker {fb!r}")
                if fb == w.name:
                    raise ValueError(f"worker {w.name!r} lists itself as a fallback")
        return self

    @property
    def default(self) -> WorkerSpec:
        """The worker that runs fallback plans: ``default_worker``, else the first LLM."""
        if self.default_worker is not None:
            return self.worker(self.default_worker)
        return next((w for w in self.workers if w.kind == "llm"), self.workers[0])

    def worker(self, name: str) -> WorkerSpec:
        for w in self.workers:
            if w.name == name:
                return w
        known = ", ".join(w.name for w in self.workers)
        raise PoolConfigError(f"unknown worker {name!r} in pool {self.source}; known: {known}")

    def with_sampling(self, name: str, temperature: float) -> Pool:
        """A copy whose worker ``name`` samples at ``temperature`` if it was greedy."""
        workers = tuple(
            w.model_copy(update={"params": {**w.params, "temperature": temperature}})
            if w.name == name and not w.temperature
            else w
            for w in self.workers
        )
        return self.model_copy(update={"workers": workers})

    def with_conductor_sampling(self, temperature: float, seed: int | None = None) -> Pool:
        """A copy whose conductor samples at ``temperature`` (``seed`` makes it repeatable)."""
        params = {**self.conductor.params, "temperature": temperature}
        if seed is not None:
            params["seed"] = seed
        return self.model_copy(
            update={"conductor": self.conductor.model_copy(update={"params": params})}
        )

    def with_conductor_hint(self, hint: ConductorHint | str) -> Pool:
        """A copy whose conductor reads ``hint`` (a plain string: after its instructions)."""
        hint = ConductorHint.model_validate(hint)
        return self.model_copy(
            update={"conductor": self.conductor.model_copy(update={"hint": hint})}
        )

    def index_of(self, name: str) -> int:
        return [w.name for w in self.workers].index(name)

    def public_dict(self) -> dict[str, Any]:
        """The pool without anything secret-adjacent, for artifacts and MLflow params."""
        return self.model_dump(mode="json", exclude={"source"})


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def pool_from_dict(data: Any, source: str = "<memory>") -> Pool:
    """Validate a parsed pool document; errors name the source and the field."""
    if not isinstance(data, dict):
        raise PoolConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return Pool.model_validate({**data, "source": source})
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise PoolConfigError(f"{source}: {_format_loc(first['loc'])}: {msg}{more}") from None


def write_pool_file(pool: Pool, directory: Path) -> Path:
    """``pool`` as a YAML file in ``directory`` (the flows take a pool as a path), named by
    its content, so the same pool is one file."""
    import hashlib

    text = yaml.safe_dump(pool.public_dict(), sort_keys=False)
    path = directory / f"pool-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path


def default_pool_path() -> Path:
    """The embedded local pool shipped with the package; copy it to start your own."""
    return Path(str(resources.files("prefect_conductor.conductor") / "pools" / "local.yaml"))


def load_pool(path: str | Path | None = None) -> Pool:
    """Load and validate a pool file; ``None`` loads the embedded local pool."""
    p = Path(path) if path is not None else default_pool_path()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PoolConfigError(f"{p}: pool file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolConfigError(f"{p}: cannot read pool file ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise PoolConfigError(f"{p}: invalid YAML{where}: {problem}") from None
    return pool_from_dict(data, source=str(p))
