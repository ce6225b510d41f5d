"""A training's small world for the tests that train on the CPU: a home, a JSONL of questions,
and a pool whose conductor is the tiny local model and whose workers are fakes (``oracle``
knows the answers, ``echo`` repeats its input)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from prefect_conductor.testing.fakes import ANSWERS


def training_world(
    tmp_path: Path,
    monkeypatch: Any,
    tiny_base: Path,
    train: dict[str, str],
    test: dict[str, str],
    meta: bool = False,
) -> tuple[Path, Path, Path]:
    """(data, pool, home): ``train`` and ``test`` map questions to answers (ids
    ``<split>-q<i>``; with ``meta`` each row has a ``level`` of 1 or 2)."""
    from prefect_conductor.conductor.providers.local_model import register

    home = tmp_path / "home"
    monkeypatch.setenv("CONDUCTOR_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CONDUCTOR_ARTIFACTS", raising=False)
    data = tmp_path / "mini.jsonl"
    rows = [
        {"id": f"{split}-q{i}", "question": q, "reference": a, "kind": "math", "split": split,
         **({"meta": {"level": 1 + i % 2}} if meta else {})}
        for split, questions in (("train", train), ("test", test))
        for i, (q, a) in enumerate(questions.items())
    ]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows))
    ANSWERS.clear()
    ANSWERS.update({q: f"The answer is {a}." for q, a in {**train, **test}.items()})
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        yaml.safe_dump(
            {
                "conductor": {
                    "model": f"local/{tiny_base}",
                    "params": {"temperature": 0.0, "max_tokens": 16},
                },
                "workers": [
                    {"name": "oracle", "model": "fake/lookup", "description": "Knows answers."},
                    {"name": "echo", "model": "fake/echo", "description": "Repeats."},
                ],
            }
        )
    )
    register()
    return data, pool, home
