"""The study's claims, one module each (c1.py ... c5.py), and what reads them all through the registry.

A claim (`base.Claim`) holds its text, scheme, rule (named conditions over the typed results it
reads), thresholds, headline number and planted cases; `registry.CLAIMS` lists them and
`summary.summarise` turns the models' typed results into the study's `verdict.Summary`. This
package imports result schemas, `analysis.stats` and its own modules only.
"""
