"""Planted models and the validation table: verdicts checked against planted truths."""
