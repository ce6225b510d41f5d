"""The ``accelerate`` configuration of multi-GPU training (issue #19 docs item):
``deployments/accelerate/multi-gpu.yaml`` parses, has what ``accelerate launch`` needs, and
accelerate's own launcher reads it as a 2-process bf16 DDP launch. No GPU is needed: the
launcher is stopped before it starts any process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deployments" / "accelerate" / "multi-gpu.yaml"


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def test_the_config_names_a_two_gpu_bf16_launch(config: dict):
    assert config["compute_environment"] == "LOCAL_MACHINE"
    assert config["distributed_type"] == "MULTI_GPU"
    assert config["num_processes"] == 2 and config["num_machines"] == 1
    assert config["mixed_precision"] == "bf16"
    assert config["use_cpu"] is False
    assert config["gpu_ids"] == "all"


def test_accelerate_reads_it_as_a_multi_gpu_launch():
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DistributedType
    from accelerate.utils.launch import prepare_multi_gpu_env

    loaded = load_config_from_file(str(CONFIG))
    assert isinstance(loaded, ClusterConfig)
    assert loaded.distributed_type == DistributedType.MULTI_GPU
    # The command line of docs/training.md, parsed and completed from the file exactly as
    # `accelerate launch` does before it spawns the processes.
    argv = ["--config_file", str(CONFIG), "-m", "prefect_conductor.cli.app", "train-conductor"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    assert args.multi_gpu and args.num_processes == 2 and args.mixed_precision == "bf16"
    assert args.module and args.training_script == "prefect_conductor.cli.app"
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert args.nproc_per_node == "2"
