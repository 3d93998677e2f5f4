"""Integrations: putting a tuned setting back into the user's framework, one module each.

Each module applies a :class:`tuner.BestSetting` where a framework builds its DataLoaders
(``tuner.integrations.lightning``: a Lightning ``Callback``; ``tuner.integrations.huggingface``:
``TrainingArguments``), so a study's result is used without rewriting the training script.
A module imports its framework; this package does not, so importing ``tuner`` never needs it.
"""
