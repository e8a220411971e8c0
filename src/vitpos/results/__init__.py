"""Typed experiment results and their pure readers (one module per experiment; `base` holds
what every result shares). Imports nothing above it: experiments write these, claims, plots and the
report read them."""
