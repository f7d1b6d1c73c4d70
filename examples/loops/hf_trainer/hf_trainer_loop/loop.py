"""A Hugging Face Transformers `Trainer` loop written as Ray Train's docs teach: Ray's `RayTrainReportCallback` reports
each checkpoint the Trainer saves, `prepare_trainer` readies the Trainer, and a resumed trial continues from
`ray.train.get_checkpoint()`. The model is a tiny BERT built from a config, the data synthetic: nothing is downloaded.

Replace the model, the data and the metrics with yours; keep the shape: evaluate and save once per epoch (the callback
reports on each save, with the metrics logged since), and resume with `resume_from_checkpoint`.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import ray.train

SEQUENCE_LENGTH = 16
VOCAB_SIZE = 64


def synthetic_dataset(samples: int, seed: int) -> Any:
    """Token sequences labelled by whether their first token lies in the vocabulary's upper half (learnable in a few
    epochs); the same samples for a seed on every worker and every run."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB_SIZE, (samples, SEQUENCE_LENGTH), generator=generator)
    labels = (input_ids[:, 0] >= VOCAB_SIZE // 2).long()

    class TokenDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]  # torch's Dataset is generic at runtime
        def __len__(self) -> int:
            return samples

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {
                "input_ids": input_ids[i],
                "attention_mask": torch.ones(SEQUENCE_LENGTH, dtype=torch.long),
                "labels": labels[i],
            }

    return TokenDataset()


def build_model(hidden: int) -> Any:
    """A one-layer BERT classifier from a config: its weights are initialised here, never fetched from a hub."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=SEQUENCE_LENGTH,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def train_loop(config: dict[str, Any]) -> None:
    # transformers takes seconds to import: inside the loop, so only Ray's Train workers pay it, not the sweep's
    # driver that imports this module to find the function.
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import Trainer, TrainingArguments

    # Hyper-parameters come from the sweep's paramSpace; config["_sweep"] (the sweep's context) is not one of them.
    epochs = int(config.get("epochs", 3))
    seed = int(config.get("seed", 0))
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,  # the Trainer's own checkpoints, local; the callback uploads each through Ray
            num_train_epochs=epochs,
            learning_rate=float(config.get("lr", 1e-3)),
            per_device_train_batch_size=int(config.get("batch_size", 32)),
            per_device_eval_batch_size=128,
            # Evaluate, log and save at the same points, so every checkpoint the callback reports carries the
            # metrics of its own epoch (eval_loss is the sweep's metric).
            eval_strategy="epoch",
            logging_strategy="epoch",
            save_strategy="epoch",
            save_total_limit=1,
            seed=seed,
            report_to="none",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=build_model(int(config.get("hidden", 32))),
            args=args,
            train_dataset=synthetic_dataset(int(config.get("train_samples", 256)), seed=seed),
            eval_dataset=synthetic_dataset(int(config.get("val_samples", 128)), seed=seed + 1),
            callbacks=[RayTrainReportCallback()],
        )
        trainer = prepare_trainer(trainer)

        # Resume where the last committed checkpoint left off (a retried worker, a resumed sweep): the Trainer
        # restores the model, optimizer, scheduler and RNG states and skips the epochs already trained.
        checkpoint = ray.train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as checkpoint_dir:
                path = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
                trainer.train(resume_from_checkpoint=path)
        else:
            trainer.train()
