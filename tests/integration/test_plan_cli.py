"""`vitpos run --plan` end to end: the CLI table, a ViT-B/16 plan, cached stages after a run."""
from __future__ import annotations

import json

from conftest import TIMM_TINY
from vitpos.experiments.base import StagePlan
from vitpos.experiments.rope_heads_plan import RopeHeadsSettings
from vitpos.experiments.rope_prefix import RopePrefixSettings
from vitpos.study.config import RunConfig
from vitpos.study.plan import StudyPlan


def test_vitpos_run_plan_prints_counts_and_writes_nothing(tmp_path, capsys):
    from vitpos.cli import main

    out = tmp_path / "out"
    spec = TIMM_TINY["rope_mixed"].replace("img_size=16", "img_size=32").replace("depth=2", "depth=3")
    main(["run", "--plan", "--quick", "--models", spec, "--data", "shapes", "--out", str(out)])
    text = capsys.readouterr().out
    assert not out.exists()
    assert "rope_freq" in text and "extrapolate" in text and "image-forwards" in text
    assert "plan: 1 model(s), 7 stage(s) to run" in text
    assert "estimated" in text


def test_plan_of_a_vit_b16_at_224_px(tmp_path):
    """The ViT-B/16 plan, counted (timing a ViT-B/16 is the benchmark's job): shapes images go
    through the model's preprocessing, and its 1000-class classifier gets a head fitted first."""
    from vitpos.study.run import plan_study

    spec = "timm:vit_base_patch16_rope_mixed_224"
    plan = plan_study(tmp_path / "out", RunConfig.model_validate({"models": [spec], "data": ["shapes"]}), measure=None)
    assert not (tmp_path / "out").exists()
    rows = {s.stage: s for s in plan.stages}
    assert rows["sae"].status == rows["ape_permute"].status == "n/a"
    heads = rows["rope_heads"].plan
    L, H, R = 12, 12, 6  # 197 tokens, restore from depth // 2
    # The hand-counted core (attention, probes, rebuild, top-1 drops): issue 29 added the restore-condition
    # axis index with its null, the R sweep and C5 under each ablation on top of it; those parts are
    # checked exactly against counted work on a tiny model (tests/unit/test_plan.py,
    # test_every_stage_plan_counts_what_runs), so here the core must still be all there.
    rh, pre = RopeHeadsSettings(), RopePrefixSettings()  # the defaults the plan reads
    n_pre, a_pre = pre.images, pre.attn_images
    a, n_p, n_t = rh.attn_images, rh.probe_images, rh.top1_images
    core_forwards = a * 2 + n_p * 3 + n_t
    # rebuild: per later head rotations off and output mean-ablated (blocks >= its layer: 21 per head
    # over layers 6..11), plus the z means / direct effects and the three joint top-5 conditions from the
    # restore stream
    core_blocks = (a * (L + 2 * H * L + L - 1) + n_p * (3 * L + (L - 1 - R) + 2 * H * 21 + 4 * (L - R))
                   + n_t * (L + H * 78))
    assert heads is not None and heads.forwards > core_forwards and heads.blocks > core_blocks
    prefix = rows["rope_prefix"].plan  # 8 conditions from the input, 4 restores from layer R
    assert prefix is not None and prefix.forwards == a_pre + n_pre * 8
    assert prefix.blocks == a_pre * L + n_pre * (8 * L + 4 * (L - R))
    freq = rows["rope_freq"].plan  # windows 0-5, 6-11, 0-11; 8 bands x axes: 0-11 from the input, 0-5 from its
    assert freq is not None and freq.forwards == 300 * 9  # stream at 6, 6-11 from the clean stream at 6
    assert freq.blocks == 300 * (L + 8 * (L + 2 * (L - R))) and freq.fits == 2 + 8 * (2 + 1 + 1)
    extra = rows["extrapolate"].plan  # 300 images at 224, 336 and 448 px (grids 14, 21, 28)
    assert extra is not None and extra.forwards == 3 * 300 and extra.blocks == 3 * 300 * L and extra.fits == 3 * L
    head = rows["head"].plan
    assert rows["head"].status == "run" and head is not None and head.forwards == 4000 + 1000 + 1000
    assert plan.data_problems == {}
    assert "time not estimated" in plan.summary()


def test_study_plan_counts_cached_stages_as_cached(tmp_path, monkeypatch):
    from vitpos.study import run as study_run
    from vitpos.study.run import plan_study, run_study

    spec = TIMM_TINY["rope_axial"].replace("img_size=16", "img_size=32")  # 8 x 8 patches of 32 px shapes
    cfg = RunConfig.model_validate({"models": [spec], "data": ["shapes"], "eval_images": 20, "probe": {"images": 20},
                                    "rope_axis": {"images": 20, "restore": [1]},
                                    "rope_heads": {"probe_images": 20, "top1_images": 20, "attn_images": 2},
                                    "rope_prefix": {"images": 20, "attn_images": 2},
                                    "rope_freq": {"images": 20, "bands": 2}, "extrapolate": {"images": 20}})
    before = plan_study(tmp_path, cfg, measure=None)
    assert [s.status for s in before.stages if s.status != "n/a"] == ["run"] * 7
    lines: list[str] = []
    run_study(tmp_path, cfg, progress=False, log=lines.append, measure=None)
    assert lines[0] == before.summary() and lines[0].startswith("plan: 1 model(s), 7 stage(s) to run, 0 cached")
    after = plan_study(tmp_path, cfg, measure=None)
    assert [s.status for s in after.stages if s.status != "n/a"] == ["cached"] * 7
    assert after.total() == StagePlan() and isinstance(after, StudyPlan)
    assert after.summary() == "plan: 1 model(s), nothing to run: all 7 stage(s) and the validation table cached"
    # the validation table is cached too, keyed by the code: a rerun reads it, changed code recomputes it
    first = (tmp_path / "results.json").read_text()
    calls: list[int] = []
    real = study_run.validation_table
    monkeypatch.setattr(study_run, "validation_table", lambda **kw: calls.append(1) or real(**kw))
    (tmp_path / "results.json").unlink()
    rerun = run_study(tmp_path, cfg, progress=False, log=lines.append, measure=None)
    assert calls == [] and rerun.timings["validation"] == 0.0
    assert rerun.summary.validation is not None and rerun.summary.validation.passes
    assert json.loads(first)["summary"]["validation"] == rerun.summary.validation.model_dump(mode="json")
    monkeypatch.setattr(study_run, "code_fingerprint", lambda: "changed-code")
    assert "then the planted-model validation table" in plan_study(tmp_path, cfg, measure=None).summary()
    table = rerun.summary.validation
    monkeypatch.setattr(study_run, "validation_table", lambda **kw: calls.append(1) or table)  # measured above
    assert study_run._validation(study_run.StageCache(tmp_path, False), lines.append)[0] == table and calls == [1]
    assert study_run._validation(study_run.StageCache(tmp_path, False), lines.append)[1] == 0.0 and calls == [1]
