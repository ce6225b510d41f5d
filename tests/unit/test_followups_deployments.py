"""The ``evaluate`` deployment's fan-out parameter (issue #19): ``conductor eval --fan-out``
from the Prefect UI, off by default, named in the form the deployment renders."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect.flows import load_flow_from_entrypoint

from conductor.plan.requests import EvalRequest

PREFECT_YAML = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"


def _evaluate() -> dict:
    deployments = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]
    return next(d for d in deployments if d["name"] == "evaluate")


def test_the_evaluate_deployment_declares_fan_out_off():
    deployment = _evaluate()
    assert deployment["parameters"]["request"]["fan_out"] is False
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    request = flow.validate_parameters(deployment["parameters"])["request"]
    assert isinstance(request, EvalRequest) and request.fan_out is False
    on = {"request": {**deployment["parameters"]["request"], "fan_out": True}}
    assert flow.validate_parameters(on)["request"].fan_out is True  # the UI's switch
    assert "fan_out" in EvalRequest.model_json_schema()["properties"]


def test_the_fan_out_comment_names_what_the_fleet_needs():
    text = PREFECT_YAML.read_text()
    comment = text[text.index("conductor eval --fan-out") : text.index("fan_out: false")]
    words = " ".join(comment.replace("#", " ").split())
    for needed in (
        "PREFECT_API_URL",
        "PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK",
        "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK",
        "`conductor serve` running on the hosts",
    ):
        assert needed in words, needed
