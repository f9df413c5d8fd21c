"""``python -m rlvr_selector_client.integrations.verl_main``: verl's PPO/GRPO entry point, with prompts chosen
by the selector service, for verl >= 0.8.

verl 0.8 removed the curriculum-sampler hook (``data.sampler.class_path`` and ``sampler.update``) that
`rlvr_selector_client.integrations.verl.SelectorCurriculumSampler` plugs into on verl 0.5-0.7. This entry
point composes verl's own ``ppo_trainer.yaml`` with the same overrides as ``python -m
verl.trainer.main_ppo``, runs verl's ``validate_config``, and then, as verl's ``main`` does, picks the
trainer by ``trainer.use_v1``:

- ``trainer.use_v1=True`` (verl 0.9's default): verl's ``TaskRunnerV1`` (``verl/trainer/main_ppo.py``)
  with the v1 trainer of ``trainer.v1.trainer_mode`` (``sync``, ``colocate_async``,
  ``separate_async``), after `rlvr_selector_client.integrations.verl_v1.install` inside the Ray task runner
  process: the prompt loader's sampler is the selector's and the replay buffer reports every group
  (see that module).
- ``trainer.use_v1=False``: verl's legacy ``TaskRunner`` (``verl.trainer.main_ppo_v0``) with
  ``create_rl_sampler`` and ``RayPPOTrainer`` replaced by the selector sampler and
  `SelectorRayPPOTrainer`, which reports every step's groups (last step included) from
  ``_update_actor``, i.e. after rewards and advantages and before the step's checkpoint. The legacy
  trainer has no ``filter_groups``: that setting is refused there.

Launch (same overrides as ``python -m verl.trainer.main_ppo``)::

    python -m rlvr_selector_client.integrations.verl_main \\
        data.train_files=... algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=8 ... \\
        data.dataloader_num_workers=0 \\
        +data.sampler.selector.url=http://selector:8000 \\
        +data.sampler.selector.dataset=gsm8k-run-7 \\
        +data.sampler.selector.strategy=insight \\
        +data.sampler.selector.rollouts_per_prompt=8
"""

from __future__ import annotations

import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from rlvr_selector_client.integrations import framework_version
from rlvr_selector_client.integrations.verl import SelectorCurriculumSampler, replace_name

__all__ = [
    "check_config",
    "install",
    "main",
    "selector_sampler",
]  # and SelectorRayPPOTrainer, built on first access

logger = logging.getLogger(__name__)


def selector_sampler(data_config: Any, dataset: Any) -> SelectorCurriculumSampler:
    """Stands in for verl's ``create_rl_sampler(data_config, dataset)``; the group size is read from the
    config the task runner is running (`_running`), since verl hands over ``config.data`` only."""
    config = _running.get("config")
    group_size = None if config is None else int(config.actor_rollout_ref.rollout.n)
    return SelectorCurriculumSampler(dataset, data_config, trainer_reports=True, group_size=group_size)


#: The config of the legacy task runner in this process (`task_runner_class`), for `selector_sampler`.
_running: dict[str, Any] = {}


def _trainer_class() -> type:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class SelectorRayPPOTrainer(RayPPOTrainer):  # type: ignore[misc,valid-type]
        """verl's ``RayPPOTrainer`` that reports each step's groups to the selector service."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            sampler = self.train_dataloader.sampler
            if not isinstance(sampler, SelectorCurriculumSampler):
                raise TypeError(
                    f"the train sampler is {type(sampler).__name__}, not the selector's; build the trainer "
                    "with train_sampler=selector_sampler(config.data, train_dataset)"
                )
            warmup = self.config.trainer.get("critic_warmup", 0) or 0
            if warmup > 0:
                raise ValueError(
                    f"trainer.critic_warmup={warmup}: the actor is not updated during warm-up, and the selector "
                    "reports each step when the actor update starts; set trainer.critic_warmup=0"
                )

        def _update_actor(self, batch: Any) -> Any:
            self.train_dataloader.sampler.update(batch=batch)
            return super()._update_actor(batch)

    SelectorRayPPOTrainer.__qualname__ = SelectorRayPPOTrainer.__name__ = "SelectorRayPPOTrainer"
    return SelectorRayPPOTrainer


def __getattr__(name: str) -> Any:
    # The trainer class subclasses verl's, so it exists only where verl is importable.
    if name == "SelectorRayPPOTrainer":
        return _trainer_class()
    raise AttributeError(name)


def install() -> type:
    """Point verl's legacy task runner at the selector sampler and trainer (in this process).

    Returns the trainer class. Idempotent."""
    import verl.trainer.main_ppo_v0 as v0

    trainer_class = getattr(v0.RayPPOTrainer, "_selector_trainer", None)
    if trainer_class is None:
        trainer_class = _trainer_class()
        trainer_class._selector_trainer = trainer_class  # type: ignore[attr-defined]
        v0.RayPPOTrainer = trainer_class
    replace_name(v0, "create_rl_sampler", selector_sampler)
    return trainer_class


def _plain_class(actor_class: Any) -> type:
    """The Python class under a ``@ray.remote`` actor class."""
    for attribute in ("__ray_actor_class__",):
        found = getattr(actor_class, attribute, None)
        if found is not None:
            return found
    return actor_class.__ray_metadata__.modified_class


def task_runner_class() -> Any:
    """A Ray actor class running verl's legacy ``TaskRunner.run`` after `install()`."""
    import ray
    import verl.trainer.main_ppo_v0 as v0

    verl_run = _plain_class(v0.TaskRunner).run

    class SelectorTaskRunner(v0.BaseTaskRunner):  # type: ignore[misc,name-defined]
        def run(self, config: Any) -> None:
            install()
            _running["config"] = config
            verl_run(self, config)

    return ray.remote(num_cpus=1)(SelectorTaskRunner)


def v1_task_runner_class() -> Any:
    """A Ray actor class running verl's ``TaskRunnerV1.run`` after `verl_v1.install()`."""
    import ray
    import verl.trainer.main_ppo as main_ppo

    verl_class = _plain_class(main_ppo.TaskRunnerV1)

    class SelectorTaskRunnerV1(verl_class):  # type: ignore[misc,valid-type]
        def run(self, config: Any) -> None:
            from rlvr_selector_client.integrations import verl_v1

            verl_v1.install()
            verl_class.run(self, config)

    return ray.remote(SelectorTaskRunnerV1)


def uses_v1(config: Any) -> bool:
    """Whether verl runs its v1 trainer for this config (verl 0.9's default: ``trainer.use_v1: true``).

    The selector's v1 route is built on verl 0.9's v1 trainer; on 0.8 the legacy trainer runs."""
    version = framework_version("verl")
    return bool(config.trainer.get("use_v1", False)) and (version is None or version >= (0, 9))


def check_config(config: Any) -> None:
    """Refuse settings the chosen trainer route cannot honour, before Ray starts."""
    if uses_v1(config):
        from rlvr_selector_client.integrations.verl_v1 import check_v1_config

        check_v1_config(config)
        return
    if config.get("data", {}).get("sampler", {}).get("class_path"):
        raise ValueError(
            "data.sampler.class_path is the verl 0.5-0.7 route; with this entry point leave it out and keep "
            "the +data.sampler.selector.* keys"
        )
    algorithm = config.get("algorithm", {})
    filter_groups = algorithm.get("filter_groups") if hasattr(algorithm, "get") else None
    if filter_groups is not None and filter_groups.get("enable", False):
        raise ValueError(
            "algorithm.filter_groups.enable=True runs only in verl's v1 trainer; with trainer.use_v1=False "
            "nothing would filter. Use trainer.use_v1=True (verl's default), or turn filter_groups off"
        )


def main(argv: list[str] | None = None) -> None:
    version = framework_version("verl")
    if version is None:
        raise SystemExit("verl is not installed in this environment")
    if version < (0, 8):
        raise SystemExit(
            f"verl {metadata.version('verl')}: use verl's own entry point (python -m verl.trainer.main_ppo) with "
            "data.sampler.class_path=pkg://rlvr_selector_client.integrations.verl "
            "data.sampler.class_name=SelectorCurriculumSampler"
        )
    import sys

    import hydra
    import verl
    from verl.trainer.main_ppo import run_ppo

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def _run(config: Any) -> None:
        try:
            from verl.utils.device import auto_set_device

            auto_set_device(config)
        except ImportError:  # pragma: no cover - older layouts
            pass
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
        check_config(config)
        runner = v1_task_runner_class() if uses_v1(config) else task_runner_class()
        run_ppo(config, task_runner_class=runner)

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    _run()


if __name__ == "__main__":
    main()
