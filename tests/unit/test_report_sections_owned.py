"""Each experiment owns its report section and summary line (issue 45, item 3): every registered
experiment renders both itself, and the report of the golden quick run is the page it was before the
sections moved out of report/sections.py into `vitpos.experiments.<name>_section`."""

from __future__ import annotations

import copy
import hashlib
import re

from conftest import GOLDEN
from vitpos.experiments.base import Experiment
from vitpos.experiments.registry import EXPERIMENTS
from vitpos.report.html import render_report
from vitpos.report.sections import CLAIM_RULES
from vitpos.results.base import Result
from vitpos.study.results import StudyResults

# sha256 of the models' part of report.html for tests/golden/run_quick_results.json (from the models
# table to the reproduce section: every experiment's section of every model). Rendered byte-identical
# by the report before and after the move; a section that goes missing or changes changes it. After an
# intended change to a section, render the golden results and put the new digest here.
# Issue 47 (intended): ape_permute's position-budget column ("not measured" in the golden results, written before
# it) and its budget paragraph; sae_layers' title names sites from the embedding.
MODELS_PART_SHA256 = "0e5406f159fb6d7c0afc043a0662e354f7f419879cb3c0ef9545ee684d0ea11a"


def models_part(page: str) -> str:
    start, end = page.index('<section id="models">'), page.index('<section id="reproduce">')
    return page[start:end]


def test_every_experiment_overrides_section_and_summary():
    for exp in EXPERIMENTS:
        assert type(exp).section is not Experiment.section, exp.name
        assert type(exp).summary is not Experiment.summary, exp.name


def test_the_golden_report_is_unchanged_and_shows_every_section(tmp_path):
    page = render_report(copy.deepcopy(GOLDEN), tmp_path).read_text(encoding="utf-8")
    part = models_part(page)
    typed = StudyResults.from_json(copy.deepcopy(GOLDEN))
    shown = 0
    for spec, entry in typed.models.items():
        blocks = re.findall(r'<section class="exp"><h3>(.*?)</h3>(.*?)</section>',
                            part.split(f"<h2>{spec}</h2>", 1)[1].split("<h2>", 1)[0])
        assert [t for t, _ in blocks] == [exp.title for exp in EXPERIMENTS], spec  # one block per experiment
        for exp, (_, body) in zip(EXPERIMENTS, blocks, strict=True):
            result = entry.results.get(exp.name)
            if isinstance(result, Result):
                own = exp.section(result, CLAIM_RULES)
                assert own and body.endswith(own), (spec, exp.name)  # below its figures: its own section
                shown += 1
    assert shown >= 14  # the quick run's results: 4 models' eval and probe, APE's sae / ape_permute, ...
    assert hashlib.sha256(part.encode()).hexdigest() == MODELS_PART_SHA256
