"""Run verl's own GRPO trainer for three epochs with ``trainer.rollout_data_dir`` set, so that verl's own
dump code writes the rollout log `selector-service replay` reads.

Runs inside the verl 0.9 venv (tests/integrations/frameworks/venvs.py). verl's legacy trainer
(``trainer.use_v1=False``) with its own dataset, its own sampler (shuffled, a new order each epoch) and
dataloader, agent loop, rule reward (the GSM8K scorer), GRPO and ``_log_rollout_data`` /
``_write_generations`` (verl/trainer/ppo/ray_trainer.py:454-477, 514-545). Faked as in drive_verl.py,
because they need GPUs: the LLM server (a `common.Policy` answers) and the FSDP actor worker group. No
selector service is involved: this is the run a team would have logged before trying the selector.

Usage: python drive_verl_dump.py --workdir DIR
Prints ``DRIVER-REPORT {json}`` last: the dump folder, its files, and what the policy earned per sample.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.integrations.frameworks import common, drive_verl

EPOCHS = 3
STEPS = EPOCHS * drive_verl.SIZE // drive_verl.BATCH  # drop_last: 12 prompts, 3 per step


def build_trainer(config: Any, tok: Any, policy: common.Policy) -> Any:
    """verl 0.9's legacy trainer as its task runner builds it (main_ppo_v0), its own sampler included,
    with the GPU workers replaced by drive_verl's fakes."""
    import verl.trainer.main_ppo_v0 as v0
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import collate_fn

    train = v0.create_rl_dataset(config.data.train_files, config.data, tok, None, is_train=True)
    val = v0.create_rl_dataset(config.data.val_files, config.data, tok, None, is_train=False)
    trainer = v0.RayPPOTrainer(
        config=config,
        tokenizer=tok,
        processor=None,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=drive_verl.FakeResources(),
        train_dataset=train,
        val_dataset=val,
        collate_fn=collate_fn,
        train_sampler=v0.create_rl_sampler(config.data, train),
    )
    trainer.actor_rollout_wg = drive_verl.FakeActorWorkers([])
    trainer.async_rollout_manager = drive_verl.rollout_manager(config, policy)
    trainer.checkpoint_manager = drive_verl.FakeCheckpointManager()
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = common.model_dir(work)
    data = work / "train.parquet"
    drive_verl.write_parquet(data)
    tok = common.tokenizer()
    policy = common.Policy(tok)
    dump = work / "rollouts"
    # drive_verl's launch line for verl 0.9's legacy trainer; the selector keys it adds are left unread:
    # no sampler class is named, so verl builds its own.
    composed = argparse.Namespace(url="http://127.0.0.1:9", dataset="unused", workdir=str(work), mode="main")
    config = drive_verl.compose(composed, model, data, steps=STEPS, resume=None)
    from omegaconf import open_dict

    with open_dict(config):
        config.trainer.total_epochs = EPOCHS
        config.trainer.save_freq = -1
        config.trainer.rollout_data_dir = str(dump)
        config.data.shuffle = True
    trainer = build_trainer(config, tok, policy)
    sampler = trainer.train_dataloader.sampler
    trainer.fit()
    common.emit(
        {
            "verl": metadata.version("verl"),
            "sampler": type(sampler).__name__,
            "dump": str(dump),
            "files": sorted(p.name for p in dump.iterdir()),
            "fed": policy.record,
            "steps": STEPS,
        }
    )


if __name__ == "__main__":
    main()
