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
    # A deployment is named after its flow, or after what it does with it (a schedule).
    expected = {"retrain-orchrm": "train-reward-model"}.get(deployment["name"], deployment["name"])
    assert flow.name == expected
    validated = flow.validate_parameters(deployment.get("parameters", {}))
    assert validated  # the default parameters are a valid form submission


def test_orchestrate_parameters_render_as_a_form():
    flow = load_flow_from_entrypoint("flows.orchestrate:orchestrate")
    schema = flow.parameters.model_dump()
    request = schema["definitions"]["OrchestrateRequest"]
    assert request["required"] == ["question"]
    assert {"question", "pool", "on_invalid_plan", "max_steps"} <= set(request["properties"])
    assert request["properties"]["on_invalid_plan"]["enum"] == ["fallback", "error"]


def test_train_conductor_deployment_targets_the_gpu_pool():
    by_name = {d["name"]: d for d in _deployments()}
    train = by_name["train-conductor"]
    assert train["work_pool"]["name"] == "conductor-gpu"
    assert train["work_pool"]["job_variables"]["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    flow = load_flow_from_entrypoint(train["entrypoint"])
    request = flow.validate_parameters(train["parameters"])["request"]
    assert request.warm_start and request.batch_size % request.num_generations == 0


def test_kubernetes_gpu_job_template_asks_for_a_gpu():
    import json

    template = json.loads((PREFECT_YAML.parent / "k8s-gpu-job-template.json").read_text())
    container = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpus }}"
    assert template["variables"]["properties"]["gpus"]["default"] == 1


def test_retrain_orchrm_runs_daily_on_the_pool_named_by_a_variable():
    from prefect.client.schemas.schedules import CronSchedule

    by_name = {d["name"]: d for d in _deployments()}
    retrain = by_name["retrain-orchrm"]
    (schedule,) = retrain["schedules"]
    CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])  # raises if invalid
    minute, hour, *every = schedule["cron"].split()
    assert minute.isdigit() and hour.isdigit() and every == ["*", "*", "*"]  # once a day
    assert retrain["work_pool"]["name"] == "{{ prefect.variables.orchrm_work_pool }}"
    register = (PREFECT_YAML.parent / "register.sh").read_text()
    assert "prefect variable set orchrm_work_pool conductor-process" in register
    flow = load_flow_from_entrypoint(retrain["entrypoint"])
    request = flow.validate_parameters(retrain["parameters"])["request"]
    assert request.since is None and request.min_pairs == 64
