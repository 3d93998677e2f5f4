"""Integrations: one module per framework, the workload in and the tuned setting out.

Each module builds a :class:`objectives.Workload` from what the framework trains with (a trial's
child loads it by ``--objective`` spec) and applies a :class:`tuner.BestSetting` where the
framework builds its DataLoaders, so a study's result is used without rewriting the training
script: ``tuner.integrations.lightning`` (a DataModule and module in, a ``Callback`` out) and
``tuner.integrations.huggingface`` (a ``Trainer`` in, ``TrainingArguments`` out). A module
imports its framework where it needs it; this package does not, so importing ``tuner`` never
needs one.
"""
