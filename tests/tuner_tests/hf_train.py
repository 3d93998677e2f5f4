# hf_train.py
import datasets
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from tuner.integrations.huggingface import tuned_training_arguments, workload_from_trainer

ARGS = TrainingArguments(output_dir="hf-out", per_device_train_batch_size=16, report_to="none")


def make_trainer(args: TrainingArguments) -> Trainer:  # your model and data; a tiny one here
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ids = torch.randint(1, 64, (256, 16)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "label": [i % 2 for i in range(256)]})
    return Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=data)


def workload():  # what the tuner loads in every trial's process
    return workload_from_trainer(make_trainer(ARGS))


if __name__ == "__main__":  # train with the tuned setting
    make_trainer(tuned_training_arguments(ARGS, objective="hf_train.py:workload")).train()
