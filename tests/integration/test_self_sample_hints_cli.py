"""``conductor train-conductor --recipe FILE`` whose self-sample stage names a bad hint file,
in a fresh CLI process (issue #18): one line naming the file and the field, exit 2, before
anything starts. The hint files themselves are ``tests/unit/test_hints.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml


def test_train_conductor_with_a_bad_hint_file_fails_in_one_line_before_training(tmp_path):
    env = {**os.environ, "CONDUCTOR_HOME": str(tmp_path / "home")}
    bad = tmp_path / "hints.yaml"
    bad.write_text(yaml.safe_dump({"examples": [{"question": "q", "steps": [{"worker": "gpt9"}]}]}))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "name": "hinted",
                "dataset": "arithmetic",
                "stages": [
                    {"kind": "collect", "questions": {"limit": 2}},
                    {"kind": "sft"},
                    {"kind": "self-sample", "name": "round", "hints": str(bad)},
                ],
            }
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefect_conductor.cli.app",
            "train-conductor",
            "--recipe",
            str(recipe),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: {bad}: examples.0.steps.0.subtask: Field required"
    ]
    assert not (tmp_path / "home" / "training").exists()  # nothing started
