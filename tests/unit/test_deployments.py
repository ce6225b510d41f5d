"""deployments/prefect.yaml: portable (no machine's directory stored), every entrypoint
resolves from the installed package, its parameters validate, the conductor home is explicit,
and the ``evaluate`` deployment's fan-out switch is off (issue #19).

The real registration against a server and a worker is tests/e2e/test_server.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint
from prefect_conductor.conductor.plan.requests import EvalRequest

PREFECT_YAML = Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml"


def _spec() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def _deployments() -> list[dict]:
    return _spec()["deployments"]


def _steps(actions: list[dict] | None) -> list[str]:
    return [name for step in actions or [] for name in step]


def test_registration_stores_no_working_directory():
    """``pull: null`` (or a missing ``pull``) makes ``prefect deploy`` store
    ``set_working_directory: <the directory it ran in>``; ``pull: []`` stores no step
    (tests/e2e/test_server.py reads the stored pull steps back from a real server)."""
    spec = _spec()
    assert "pull" in spec and spec["pull"] == []
    for d in _deployments():
        # A deployment-level pull would override the top level: none, or empty too.
        assert d.get("pull", []) == [], d["name"]
    for actions in [spec.get("build"), spec.get("push"), spec["pull"]]:
        assert not any("working_directory" in s or "git_clone" in s for s in _steps(actions))


def test_every_deployment_sets_an_explicit_conductor_home():
    for d in _deployments():
        env = d["work_pool"]["job_variables"]["env"]
        assert env["CONDUCTOR_HOME"] == "{{ $CONDUCTOR_HOME }}", d["name"]
    register = (PREFECT_YAML.parent / "register.sh").read_text()
    assert "export CONDUCTOR_HOME" in register  # filled, absolute, before `prefect deploy`


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_entrypoint_is_a_module_of_the_installed_package(deployment):
    """As a worker imports it: from sys.path, not a file. That a process elsewhere, without
    this checkout on PYTHONPATH, finds the same module is
    ``tests/integration/test_deployment_entrypoints.py``."""
    import importlib.util

    module = deployment["entrypoint"].partition(":")[0]
    assert not module.endswith(".py") and "/" not in module
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin.endswith(".py")


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
    flow = load_flow_from_entrypoint("prefect_conductor.flows.orchestrate:orchestrate")
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
    grpo = request.recipe.stage("grpo")
    assert grpo.max_steps == 200 and grpo.per_device_train_batch_size == 32
    assert [s.kind for s in request.recipe.stages][:3] == ["eval", "collect", "sft"]


def test_train_conductor_parameters_pass_the_schema_prefect_enforces():
    """A deployment's parameters are checked against the flow's JSON schema when a run is
    created (``enforce_parameter_schema``): a recipe given by name must pass it."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    train = {d["name"]: d for d in _deployments()}["train-conductor"]
    flow = load_flow_from_entrypoint(train["entrypoint"])
    schema = parameter_schema(flow).model_dump()
    for parameters in (train["parameters"], train["schedules"][0]["parameters"]):
        assert validate(parameters, schema, raise_on_error=False) == []


def test_train_conductor_retrains_weekly_from_the_incumbent():
    from prefect.client.schemas.schedules import CronSchedule
    from prefect_conductor.conductor.adapters import INCUMBENT

    train = {d["name"]: d for d in _deployments()}["train-conductor"]
    (schedule,) = train["schedules"]
    CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])  # raises if invalid
    minute, hour, day, month, weekday = schedule["cron"].split()
    assert (day, month) == ("*", "*") and weekday.isdigit()  # once a week
    flow = load_flow_from_entrypoint(train["entrypoint"])
    request = flow.validate_parameters(schedule["parameters"])["request"]
    assert request.recipe.init_adapter == INCUMBENT and request.promote
    # On the task set the shipped conductor was trained on, as the deployment's own default.
    default = flow.validate_parameters(train["parameters"])["request"]
    assert request.recipe.dataset == default.recipe.dataset == "mixed"


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


def _evaluate() -> dict:
    return next(d for d in _deployments() if d["name"] == "evaluate")


def test_the_evaluate_deployment_declares_fan_out_off():
    """``conductor eval --fan-out`` from the Prefect UI (issue #19): off by default, named in
    the form the deployment renders."""
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


def test_every_deployment_runs_with_the_offline_defaults():
    """Issue #39: the defaults of the CLI and the Python API apply to deployment runs too."""
    from prefect_conductor.runtime.quiet import OFFLINE_DEFAULTS

    for deployment in _deployments():
        env = deployment["work_pool"]["job_variables"]["env"]
        assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True", deployment["name"]
        for key, value in OFFLINE_DEFAULTS.items():
            if key != "PREFECT_SERVER_ANALYTICS_ENABLED":  # the server's, not the run's
                assert env[key] == value, (deployment["name"], key)


def test_the_improve_loop_runs_weekly_and_its_parameters_pass_the_schema():
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    loop = {d["name"]: d for d in _deployments()}["improve"]
    (schedule,) = loop["schedules"]
    CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])  # raises if invalid
    minute, hour, day, month, weekday = schedule["cron"].split()
    assert (day, month) == ("*", "*") and weekday.isdigit()  # once a week
    flow = load_flow_from_entrypoint(loop["entrypoint"])
    assert (
        validate(loop["parameters"], parameter_schema(flow).model_dump(), raise_on_error=False)
        == []
    )
    request = flow.validate_parameters(loop["parameters"])["request"]
    assert request.recipe == "improve" and request.promote and request.min_new_runs >= 1
    assert request.reward_model["min_pairs"] == 64
