"""Training recipes (issue #40): a YAML file of stages, loaded into one typed config.

A recipe says *how* a conductor is trained, in order, each stage with its own settings::

    name: default
    dataset: mixed               # training questions (built-in name or a file)
    heldout: {split: test, limit: 50}
    stages:
      - {kind: eval, name: before, conductor: start}
      - {kind: collect, name: collect, questions: {limit: 100}}
      - {kind: sft, name: warm-start, num_train_epochs: 2}
      - {kind: self-sample, name: round, rounds: 2, questions: {limit: 64}, num_generations: 4}
      - {kind: grpo, name: grpo, max_steps: 24}
      - {kind: eval, name: after}

Stage kinds: ``collect`` (each single worker, or a ``teacher`` conductor, answers training
questions: their verified-correct plans are SFT data), ``sft`` (TRL ``SFTTrainer`` on every
verified plan stored, balanced over workers), ``self-sample`` (the current conductor samples
``num_generations`` plans per question, every plan runs and is verified, then an SFT; one
stage per round), ``grpo`` (TRL ``GRPOTrainer`` on executed plans) and ``eval`` (held-out
questions). Field names are TRL's where TRL has one (``num_train_epochs``, ``learning_rate``,
``per_device_train_batch_size``, ``max_steps``, ``num_generations``, ``beta``, ``loss_type``,
``reward_weights``, ``max_completion_length``).

Questions are chosen without offsets: ``questions`` names a data set, a split, ``where``
filters on the examples' ``meta`` (``{level: 1}``) and, with ``fresh`` (the default), skips
questions an earlier stage of the same training already used, so rounds walk through a split
in its order; the built-in ``words`` data set is ordered easiest first (``curriculum``).

Loading: :func:`load_recipe` takes a built-in name (``list_recipes``) or a file, applies
``--set`` overrides (``stages.grpo.max_steps=0``: a stage by name or index) and validates;
any error is one line naming the file, the stage and the field. Pure: no Prefect, no torch.
"""

from __future__ import annotations

import copy
import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from prefect_conductor.conductor.errors import ConductorError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

__all__ = [
    "CollectStage",
    "EvalStage",
    "GrpoStage",
    "Guide",
    "Questions",
    "Recipe",
    "RecipeError",
    "SelfSampleStage",
    "SftSettings",
    "SftStage",
    "Stage",
    "apply_overrides",
    "list_recipes",
    "load_recipe",
    "recipe_digest",
    "recipe_text",
]

_FORBID = ConfigDict(extra="forbid")


class RecipeError(ConductorError):
    """A recipe that cannot be found, parsed or validated; the message is one line."""


class Questions(BaseModel):
    """Which training questions a stage uses."""

    model_config = _FORBID

    dataset: str | None = Field(default=None, description="Default: the recipe's dataset.")
    split: str = Field(default="train", description="Never a held-out split.")
    limit: int = Field(default=100, ge=1, description="Questions at most.")
    where: dict[str, Any] = Field(
        default_factory=dict,
        description="Keep examples whose meta has these values, e.g. {level: 1}.",
    )
    fresh: bool | Literal["store"] = Field(
        default=True,
        description="true: skip questions an earlier stage of this training used (rounds "
        "walk through the split in its order instead of naming offsets); store: also those "
        "any earlier training sampled (the improvement loop's rounds).",
    )


class HeldOut(BaseModel):
    """The held-out questions of ``eval`` stages and of promotion."""

    model_config = _FORBID

    dataset: str | None = Field(default=None, description="Default: the recipe's dataset.")
    split: str = "test"
    limit: int | None = Field(default=50, ge=1)


class SftSettings(BaseModel):
    """One supervised stage (TRL ``SFTConfig`` names)."""

    model_config = _FORBID

    num_train_epochs: float = Field(default=2.0, gt=0)
    learning_rate: float = Field(default=1e-3, gt=0)
    per_device_train_batch_size: int = Field(default=4, ge=1)
    max_examples: int = Field(
        default=160,
        ge=1,
        description="Verified plans at most, a seeded draw balanced over the workers they use.",
    )
    init: Literal["start", "previous"] = Field(
        default="start",
        description="Where the LoRA starts: 'start' (the recipe's start: a new LoRA on the "
        "base, or init_adapter; expert iteration) or 'previous' (the last stage's adapter).",
    )
    data: Literal["store", "training"] = Field(
        default="store",
        description="Verified plans of the whole store (outside the held-out questions), or "
        "only of this training's own runs.",
    )
    stages: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Only the verified plans of these stages of this training (this one or "
        "earlier ones; a self-sample stage's name covers its rounds), e.g. a curriculum "
        "round that learns its own plans without replaying every collected one.",
    )


class _Stage(BaseModel):
    model_config = _FORBID

    name: str = Field(default="", description="Unique; default: the kind.")


class CollectStage(_Stage):
    kind: Literal["collect"]
    questions: Questions = Field(default_factory=Questions)
    workers: list[str] | None = Field(
        default=None, description="Single workers that answer (default: every worker)."
    )
    teacher: str | None = Field(
        default=None,
        description="A conductor that plans instead (a litellm model such as "
        "openai/gpt-4.1 or an adapter): its verified plans are distilled by the next sft.",
    )


class SftStage(_Stage, SftSettings):
    kind: Literal["sft"]


class Guide(BaseModel):
    """OrchRM-guided sampling (issue #41): the plans are written, identical ones merged,
    OrchRM scores the rest plan-only and only the best ``execute`` run; the others never
    do, so they cost no worker call."""

    model_config = _FORBID

    orchrm: str = Field(
        default="models:/orchrm@champion", description="The reward model: models:/… or a dir."
    )
    execute: int = Field(default=1, ge=1, description="Plans executed per question.")


class SelfSampleStage(_Stage):
    kind: Literal["self-sample"]
    rounds: int = Field(default=1, ge=1, description="Expanded to stages NAME-1 … NAME-N.")
    questions: Questions = Field(default_factory=lambda: Questions(limit=64))
    num_generations: int = Field(default=4, ge=1, le=16, description="Plans per question.")
    temperature: float = Field(default=1.0, gt=0)
    hints: str | None = Field(
        default=None,
        description="Worked examples in the sampling prompt only (a YAML file "
        "or a built-in name: word-problems, one-operation).",
    )
    guide: Guide | None = Field(
        default=None,
        description="OrchRM-guided: run only OrchRM's top plans per question (None: every "
        "sampled plan runs).",
    )
    min_right: int | None = Field(
        default=None,
        ge=1,
        description="Sample again (num_generations more plans for each question without a "
        "right plan yet) until the stage has this many right plans, or max_generations.",
    )
    max_generations: int | None = Field(
        default=None,
        ge=1,
        description="With min_right: plans per question at most (default 4 x num_generations).",
    )
    sft: SftSettings = Field(default_factory=SftSettings)

    @model_validator(mode="after")
    def _until(self) -> SelfSampleStage:
        if self.max_generations is not None and self.min_right is None:
            raise ValueError("max_generations needs min_right (sampling until enough are right)")
        if self.min_right is not None and self.guide is not None:
            raise ValueError("min_right samples every plan it runs; it does not take a guide")
        if self.max_generations is not None and self.max_generations < self.num_generations:
            raise ValueError(
                f"max_generations ({self.max_generations}) must be at least num_generations "
                f"({self.num_generations})"
            )
        return self

    @property
    def generation_cap(self) -> int:
        """Plans per question at most."""
        if self.min_right is None:
            return self.num_generations
        return self.max_generations or 4 * self.num_generations


class GrpoStage(_Stage):
    kind: Literal["grpo"]
    questions: Questions = Field(default_factory=lambda: Questions(limit=1000, fresh=False))
    max_steps: int = Field(default=24, ge=0, description="0: the stage does nothing.")
    num_generations: int = Field(default=4, ge=2)
    per_device_train_batch_size: int = Field(default=4, ge=2)
    max_completion_length: int = Field(default=192, ge=16)
    learning_rate: float = Field(default=5e-5, gt=0)
    temperature: float = Field(default=1.0, gt=0)
    beta: float = Field(default=0.0, ge=0)
    loss_type: str = "grpo"
    lr_scheduler_type: str = "cosine"
    reward_weights: dict[Literal["plan", "token_cost", "orchrm"], float] = Field(
        default_factory=lambda: {"plan": 1.0},
        description="plan: 0 / 0.5 / 1 of the executed plan; token_cost: minus tokens/1k; "
        "orchrm: OrchRM's score of the plan.",
    )
    orchrm: str | None = Field(default=None, description="Default models:/orchrm@champion.")
    reward: Literal["executed", "orchrm"] = Field(
        default="executed",
        description="executed: every rollout's plan runs and its outcome is the reward; "
        "orchrm: OrchRM's score of the plan is the reward, and only execute_fraction of the "
        "rollouts run, to check OrchRM (its agreement with their outcomes is logged).",
    )
    execute_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="With reward: orchrm, the share of rollouts executed (default 0.1).",
    )

    @model_validator(mode="after")
    def _group(self) -> GrpoStage:
        if self.per_device_train_batch_size % self.num_generations:
            raise ValueError(
                f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be a "
                f"multiple of num_generations ({self.num_generations})"
            )
        if self.reward_weights.get("plan", 0) <= 0:
            raise ValueError("reward_weights.plan must be > 0 (the plan's reward)")
        if self.reward == "executed" and self.execute_fraction not in (None, 1):
            raise ValueError("execute_fraction needs reward: orchrm (executed runs every plan)")
        if self.reward == "orchrm":
            extra = sorted(k for k in ("token_cost", "orchrm") if self.reward_weights.get(k))
            if extra:
                raise ValueError(
                    f"reward: orchrm scores every plan with OrchRM already; reward_weights "
                    f"{', '.join(extra)} need every plan executed (reward: executed)"
                )
        return self

    @property
    def fraction_executed(self) -> float:
        """The share of rollouts that run."""
        if self.reward == "executed":
            return 1.0
        return self.execute_fraction if self.execute_fraction is not None else 0.1


class EvalStage(_Stage):
    kind: Literal["eval"]
    conductor: Literal["start", "current"] = Field(
        default="current",
        description="start: what training starts from; current: the last stage's adapter.",
    )
    dataset: str | None = Field(default=None, description="Default: the held-out data set.")
    split: str | None = None
    limit: int | None = Field(default=None, ge=1)


Stage = Annotated[
    CollectStage | SftStage | SelfSampleStage | GrpoStage | EvalStage, Field(discriminator="kind")
]


class Recipe(BaseModel):
    """A training recipe: what to train on and the stages, in order."""

    model_config = _FORBID

    name: str = "recipe"
    description: str = ""
    dataset: str = Field(default="mixed", description="Training questions (name or file).")
    heldout: HeldOut = Field(default_factory=HeldOut)
    base: str = Field(default="smollm2-135m-instruct", description="Local base or HF dir.")
    init_adapter: str | None = Field(
        default=None, description="Start from this conductor instead of a new LoRA."
    )
    prompt: Literal["full", "compact"] = "compact"
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    seed: int = 0
    stages: list[Stage] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> Recipe:
        expanded: list[Any] = []
        bases: list[str] = []
        for stage in self.stages:
            base = stage.name or stage.kind
            if isinstance(stage, SelfSampleStage) and stage.rounds > 1:
                for i in range(1, stage.rounds + 1):
                    expanded.append(stage.model_copy(update={"name": f"{base}-{i}", "rounds": 1}))
                    bases.append(base)
            else:
                expanded.append(stage.model_copy(update={"name": base}))
                bases.append(base)
        expanded = [_resolve_sft_stages(expanded, bases, i) for i in range(len(expanded))]
        last = expanded[-1] if expanded else None
        if not (
            isinstance(last, EvalStage)
            and last.conductor == "current"
            and last.dataset is None
            and last.split is None
            and last.limit is None
        ):  # promotion compares the final conductor on the held-out questions
            names = {s.name for s in expanded}
            expanded.append(
                EvalStage(kind="eval", name="after" if "after" not in names else "after-final")
            )
        seen: set[str] = set()
        for stage in expanded:
            if stage.name in seen:
                raise ValueError(f"two stages are named {stage.name!r}; give them names")
            seen.add(stage.name)
        self.__dict__["stages"] = expanded
        return self

    def stage(self, name: str) -> Any:
        return next(s for s in self.stages if s.name == name)

    def to_yaml(self) -> str:
        """The recipe as it runs (rounds expanded, defaults filled in)."""
        return yaml.dump(self.model_dump(mode="json"), Dumper=_Dumper, sort_keys=False)


def _resolve_sft_stages(stages: list[Any], bases: list[str], i: int) -> Any:
    """Stage ``i`` with its SFT's ``stages`` written as the expanded stage names they cover
    (this stage and the ones before it; a round-expanded name covers its rounds so far)."""
    stage = stages[i]
    settings = stage if isinstance(stage, SftStage) else getattr(stage, "sft", None)
    if settings is None or settings.stages is None:
        return stage
    field = "stages" if settings is stage else "sft.stages"
    names: list[str] = []
    for wanted in settings.stages:
        upto = zip(stages[: i + 1], bases[: i + 1], strict=True)
        hits = [s.name for s, base in upto if wanted in (s.name, base)]
        if not hits:
            earlier = ", ".join(dict.fromkeys(bases[: i + 1]))
            raise ValueError(
                f"stage {stage.name}: {field}: {wanted!r} is not this stage or an earlier one "
                f"({earlier})"
            )
        names.extend(h for h in hits if h not in names)
    resolved = settings.model_copy(update={"stages": names})
    if settings is stage:
        return resolved
    return stage.model_copy(update={"sft": resolved})


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as a person writes a recipe."""


_Dumper.add_representer(
    str,
    lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None),
)


# --- loading ---------------------------------------------------------------------------------

_BUILTIN = "recipes"


def _builtin_dir() -> Any:
    return resources.files("prefect_conductor.conductor.training").joinpath(_BUILTIN)


def list_recipes() -> dict[str, str]:
    """Built-in recipes: name -> first line of the description."""
    out = {}
    for entry in sorted(_builtin_dir().iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text()) or {}
            out[entry.name.removesuffix(".yaml")] = str(data.get("description", "")).split("\n")[0]
    return out


def recipe_text(name_or_path: str | Path) -> tuple[str, str]:
    """(where, YAML text) of a built-in name or a file."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise RecipeError(f"recipe {str(path)!r}: no such file")
        return str(path), path.read_text()
    entry = _builtin_dir().joinpath(f"{name_or_path}.yaml")
    if not entry.is_file():
        raise RecipeError(
            f"unknown recipe {str(name_or_path)!r}: not a built-in ({', '.join(list_recipes())})"
            " and no such file"
        )
    return f"{name_or_path} (built-in)", entry.read_text()


def _stage_index(stages: list[Any], key: str, where: str) -> int:
    if key.isdigit():
        if int(key) >= len(stages):
            raise RecipeError(f"recipe {where}: --set: no stage {key} ({len(stages)} stages)")
        return int(key)
    for i, stage in enumerate(stages):
        name = stage.get("name") or stage.get("kind") if isinstance(stage, dict) else None
        if name == key:
            return i
    names = [s.get("name") or s.get("kind") for s in stages if isinstance(s, dict)]
    raise RecipeError(f"recipe {where}: --set: no stage named {key!r} (stages: {', '.join(names)})")


def apply_overrides(data: dict[str, Any], overrides: list[str], where: str) -> dict[str, Any]:
    """``KEY=VALUE`` settings, a dotted path into the recipe (``stages.NAME.field``, a stage by
    name or index); the value is read as YAML (``0``, ``1e-4``, ``false``, ``[a, b]``)."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not sep or not parts:
            raise RecipeError(f"recipe {where}: --set {item!r}: expected KEY=VALUE")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node: Any = data
        # What the node holds once validated: a mapping the recipe does not spell out starts
        # from its defaults (``reward_weights.orchrm=1`` keeps ``plan``), never from {}.
        full: Any = {"heldout": HeldOut().model_dump(mode="json")}
        if parts[0] == "stages":
            if len(parts) < 3:
                raise RecipeError(f"recipe {where}: --set {key}: name a stage and a field")
            stages = data.get("stages") or []
            node, parts = stages[_stage_index(stages, parts[1], where)], parts[2:]
            full = _validated(node)
        for part in parts[:-1]:
            default = full.get(part) if isinstance(full, dict) else None
            if not isinstance(node.get(part), dict):
                if part in node and node[part] is not None:
                    raise RecipeError(f"recipe {where}: --set {key}: {part} is not a mapping")
                node[part] = copy.deepcopy(default) if isinstance(default, dict) else {}
            node, full = node[part], default
        node[parts[-1]] = value
    return data


def _validated(stage: Any) -> dict[str, Any]:
    """``stage`` (a raw mapping) with its defaults filled in, or {} if it does not validate."""
    try:
        return TypeAdapter(Stage).validate_python(stage).model_dump(mode="json")
    except ValidationError:
        return {}


def _one_line(exc: ValidationError, data: dict[str, Any], where: str) -> str:
    err = exc.errors()[0]
    loc = list(err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if loc[:1] == ["stages"] and len(loc) > 1 and isinstance(loc[1], int):
        i = loc[1]
        raw = data.get("stages", [])[i] if i < len(data.get("stages", [])) else {}
        name = (raw.get("name") or raw.get("kind")) if isinstance(raw, dict) else None
        field = ".".join(str(p) for p in loc[3:]) if len(loc) > 2 else ""
        label = f"stage {i + 1} ({name})" if name else f"stage {i + 1}"
        return f"recipe {where}: {label}: {field + ': ' if field else ''}{msg}"
    field = ".".join(str(p) for p in loc)
    return f"recipe {where}: {field + ': ' if field else ''}{msg}"


def load_recipe(name_or_path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """A built-in recipe or a YAML file, with ``KEY=VALUE`` overrides, validated."""
    where, text = recipe_text(name_or_path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise RecipeError(f"recipe {where}: not valid YAML{at}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {where}: expected a mapping of settings with 'stages'")
    data = apply_overrides(data, list(overrides or []), where)
    return recipe_from_dict(data, where)


def recipe_from_dict(data: dict[str, Any], where: str = "(dict)") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_one_line(exc, data, where)) from None


def recipe_digest(recipe: Recipe, **context: Any) -> str:
    """Twelve hex digits naming this recipe with its settings (and ``context``: the pool, …):
    a killed training of the same digest resumes."""
    blob = json.dumps(
        {"recipe": recipe.model_dump(mode="json"), **context}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
