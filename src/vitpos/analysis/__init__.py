"""Analyses of captured activations (probes, ...)."""
