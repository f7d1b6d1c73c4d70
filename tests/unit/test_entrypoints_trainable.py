"""The trial driver's Ray objects, built without a cluster: scaling (R4), resources (R5, R14), retry classes (R12),
the function trainable (R17), TuneReportCallback inside the trial (R18) and the two RunConfigs kept apart (R19)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import ray.train
import ray.tune
from ray.train.v2.api.config import FailureConfig as TrainFailureConfig

from sweep_contracts import constants
from sweep_contracts.runspec import build_run_spec
from sweep_operator.validation import parse_sweep
from tests.support.factories import changed, cpu_sweep, gpu_sweep
from training_entrypoints import trainable
from training_entrypoints.search import EntrypointError
from training_entrypoints.trainable import (
    RankReportCallback,
    checkpoint_config,
    load_train_loop,
    make_trial_driver,
    scaling_config,
    train_failure_config,
    train_run_config,
    trial_context,
    trial_driver_resources,
)


def test_scaling_config_sets_workers_gpu_and_per_worker_resources_never_trainer_resources_R4() -> None:
    """R4: ScalingConfig(num_workers, use_gpu, resources_per_worker); trainer_resources raises in V2, so never set."""
    config = scaling_config(parse_sweep(gpu_sweep()).spec)
    assert config.num_workers == 2 and not config.elasticity_enabled
    assert config.use_gpu is True
    assert config.resources_per_worker == {"CPU": 4.0, "GPU": 1.0}
    assert config.trainer_resources is None
    with pytest.raises(DeprecationWarning):
        ray.train.ScalingConfig(num_workers=2, trainer_resources={"CPU": 1})


def test_cpu_workers_ask_for_fractional_cpus_and_no_gpu_or_memory_R4_R15() -> None:
    """Pod memory is a Kubernetes limit (R15), not a Ray resource a bundle must find."""
    spec = parse_sweep(changed(cpu_sweep(), {"spec.trial.resourcesPerWorker": {"cpu": "500m", "memory": "2Gi"}})).spec
    config = scaling_config(spec)
    assert config.use_gpu is False and config.resources_per_worker == {"CPU": 0.5}


def test_every_train_retry_class_is_set_from_the_failure_policy_R12() -> None:
    """R12: Ray's V2 defaults (controller_failure_limit=-1, max_preemption_failures=-1) retry forever."""
    failure = train_failure_config(parse_sweep(gpu_sweep()).spec)
    assert isinstance(failure, TrainFailureConfig)
    assert (failure.max_failures, failure.controller_failure_limit, failure.max_preemption_failures) == (1, 3, 5)
    defaults = TrainFailureConfig()
    assert (defaults.controller_failure_limit, defaults.max_preemption_failures) == (-1, -1)


def test_checkpoint_retention_ranks_by_score_attribute_or_the_tune_metric() -> None:
    spec = parse_sweep(gpu_sweep()).spec
    config = checkpoint_config(spec)
    assert (config.num_to_keep, config.checkpoint_score_attribute, config.checkpoint_score_order) == (
        2,
        "val_loss",
        "min",
    )
    defaulted = parse_sweep(changed(gpu_sweep(), {"spec.checkpoints": {"numToKeep": 3}})).spec
    config = checkpoint_config(defaulted)
    assert (config.num_to_keep, config.checkpoint_score_attribute, config.checkpoint_score_order) == (
        3,
        "val_loss",
        "min",
    )


def test_trial_drivers_take_the_head_slot_and_no_cpu_when_the_cluster_offers_it_R5_R14() -> None:
    """R5/R14: a trial driver never holds a CPU its train workers need; the head's slots admit maxConcurrentTrials."""
    assert trial_driver_resources({"CPU": 8.0, constants.TRIAL_DRIVER_RESOURCE: 2.0}) == {
        "CPU": 0,
        constants.TRIAL_DRIVER_RESOURCE: 1,
    }
    assert trial_driver_resources({"CPU": 8.0}) == {"CPU": trainable.FALLBACK_TRIAL_DRIVER_CPU}


def test_the_trial_driver_is_a_plain_function_not_a_trainer_R17() -> None:
    """R17: Tune gets a function trainable that builds the TorchTrainer itself; never a V2 Trainer instance."""
    run_spec = build_run_spec(parse_sweep(cpu_sweep()), "abc123")
    driver = make_trial_driver(run_spec)
    assert inspect.isfunction(driver) and list(inspect.signature(driver).parameters) == ["config"]
    source = inspect.getsource(make_trial_driver)
    assert "TorchTrainer(" in source and "train_loop_config=" in source and "trainer_resources" not in source


def test_each_trial_gets_its_own_train_run_name_and_context_R17() -> None:
    run_spec = build_run_spec(parse_sweep(cpu_sweep()), "abc123")
    assert trial_context(run_spec, "t_00001") == {
        "namespace": "default",
        "sweep": "digits-cpu",
        "runId": "abc123",
        "trialId": "t_00001",
        "runRoot": "s3://bucket/sweeps/default/digits-cpu-abc123",
    }


def test_train_run_config_needs_a_tune_session_R18() -> None:
    """R18: TuneReportCallback takes no arguments and raises outside a Tune session, so it is built in the trial."""
    run_spec = build_run_spec(parse_sweep(cpu_sweep()), "abc123")
    with pytest.raises(RuntimeError, match="TuneReportCallback must be used in a Tune session"):
        train_run_config(run_spec, "t_00000")


def test_train_run_config_is_trains_own_class_with_its_own_settings_R18_R19(monkeypatch: pytest.MonkeyPatch) -> None:
    """R19: the Trainer gets ray.train.RunConfig (its storage under train/, all retry classes); the Tuner gets
    ray.tune.RunConfig. R18: the rank callback runs before TuneReportCallback, which forwards metrics[0]."""
    import ray.tune.integration.ray_train as ray_train_integration

    monkeypatch.setattr(ray_train_integration, "_in_tune_session", lambda: True)
    monkeypatch.setattr(
        ray_train_integration,
        "get_session",
        lambda: type("S", (), {"_get_or_create_inter_actor_queue": lambda self: None})(),
    )
    run_spec = build_run_spec(parse_sweep(cpu_sweep()), "abc123")
    config = train_run_config(run_spec, "t_00000")
    assert type(config) is ray.train.RunConfig and type(config) is not ray.tune.RunConfig
    assert config.name == "t_00000"
    assert config.storage_path == "s3://bucket/sweeps/default/digits-cpu-abc123/train"
    assert isinstance(config.failure_config, TrainFailureConfig)
    # the commit record of a checkpoint starts before TuneReportCallback's report, which may wait on the trial
    assert [type(c).__name__ for c in config.callbacks] == [
        "RankReportCallback",
        "CommitRecordCallback",
        "TuneReportCallback",
    ]
    assert config.callbacks[1]._train_run_dir == "s3://bucket/sweeps/default/digits-cpu-abc123/train/t_00000"


def test_rank_callback_forwards_the_rank_count_and_the_metric_spread_R8_R9(caplog: pytest.LogCaptureFixture) -> None:
    callback = RankReportCallback("val_loss")
    aggregated = [{"val_loss": 0.5, "epoch": 1}, {"val_loss": 0.5, "epoch": 1}]
    original = aggregated[0]
    callback.after_report(None, aggregated, None)
    assert aggregated[0] == {"val_loss": 0.5, "epoch": 1, "ranks_reported": 2, "val_loss_rank_spread": 0.0}
    assert original == {"val_loss": 0.5, "epoch": 1}  # Train's own dict is left alone
    assert "R9" not in caplog.text

    per_rank = [{"val_loss": 0.25}, {"val_loss": 0.75}]
    callback.after_report(None, per_rank, None)
    assert per_rank[0]["val_loss_rank_spread"] == 0.5
    assert "differs across ranks" in caplog.text and "R9" not in caplog.text  # what users read names no rule id


def test_load_train_loop_names_the_field_when_the_loop_is_missing() -> None:
    assert load_train_loop("training_entrypoints.loops.scalar:train_loop").__name__ == "train_loop"
    with pytest.raises(EntrypointError, match=r"spec\.trainLoop: cannot import module 'no_such_pkg\.loops'"):
        load_train_loop("no_such_pkg.loops:train_loop")
    with pytest.raises(
        EntrypointError, match=r"spec\.trainLoop: module 'training_entrypoints\.loops\.scalar' has no function 'nope'"
    ):
        load_train_loop("training_entrypoints.loops.scalar:nope")


def test_a_v2_trainer_instance_is_not_a_tune_trainable_R17(tmp_path: Any) -> None:
    """R17: handing a V2 Trainer to tune.Tuner fails (TuneError), which is why the trial driver is a function."""
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(lambda config: None, scaling_config=ray.train.ScalingConfig(num_workers=1))
    with pytest.raises(ray.tune.TuneError, match="not string nor trainable"):
        ray.tune.Tuner(trainer, run_config=ray.tune.RunConfig(storage_path=str(tmp_path)))
