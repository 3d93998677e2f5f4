"""Putting a tuned setting back into the user's framework: one module per framework.

Each module imports its framework only when called, so importing ``tuner`` never needs it.
"""
