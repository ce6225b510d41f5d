"""deployments/prefect.yaml: every entrypoint resolves and its parameters validate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

PREFECT_YAML = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"


def _deployments() -> list[dict]:
    return yaml.safe_load(PREFECT_YAML.read_text())["deployments"]


def test_orchestrate_deployment_is_defined_on_a_process_pool():
    by_name = {d["name"]: d for d in _deployments()}
    assert "orchestrate" in by_name
    assert by_name["orchestrate"]["work_pool"]["name"] == "conductor-process"


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_entrypoint_resolves_and_parameters_validate(deployment):
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert flow.name == deployment["name"]
    validated = flow.validate_parameters(deployment.get("parameters", {}))
    assert validated  # the default parameters are a valid form submission


def test_orchestrate_parameters_render_as_a_form():
    flow = load_flow_from_entrypoint("flows.orchestrate:orchestrate")
    schema = flow.parameters.model_dump()
    request = schema["definitions"]["OrchestrateRequest"]
    assert request["required"] == ["question"]
    assert {"question", "pool", "on_invalid_plan", "max_steps"} <= set(request["properties"])
    assert request["properties"]["on_invalid_plan"]["enum"] == ["fallback", "error"]
