"""The sae_layers stage: the SAE layer as a sweep inside `vitpos run` (an SAE, C1 and C2 per layer)."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY, tiny_own, toy_set
from vitpos.experiments.base import StageInput
from vitpos.experiments.registry import BY_NAME
from vitpos.results.sae_layers import SAELayersResult
from vitpos.study.config import RunConfig, load_config

SMALL = {"images": 300, "eval_images": 40, "epochs": 1, "expansion": 2, "k": 4, "permute_images": 40, "seeds": 1}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The stage run on a tiny depth-3 APE model (layers 0 and 1 swept; the last has no downstream)."""
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface

    torch.manual_seed(0)
    cfg = OwnViTConfig(pe="ape", **{**TINY, "depth": 3})
    s = OwnSurface(build_own_vit(cfg).eval(), "tiny:ape3", cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # predictions that vary from image to image
        for p in s.model.parameters():
            p.normal_(0, 0.3)
    exp = BY_NAME["sae_layers"]
    run_cfg = RunConfig.model_validate({"sae_layers": SMALL})
    settings = exp.stage_settings(run_cfg, s, {}, False)
    out = tmp_path_factory.mktemp("sae_layers")
    stage = StageInput(data=toy_set(300), seed=0, settings=settings, prior={}, out=out / "stage",
                       progress=False, quick=False, root=out)
    return exp, exp.run_stage(s, stage), out


def test_the_stage_measures_the_embedding_then_one_point_per_swept_layer(swept):
    exp, res, out = swept
    assert isinstance(res, SAELayersResult) and res.layers == [0, 1] and res.sites == ["embed", "L0", "L1"]
    assert res.layer_rule == "the embedding, then every block output 0..1" and res.sae_images == 300
    assert res.seeds == [0]
    for p in res.points:  # each site's SAE and permutation, typed, as the claims re-read them
        assert p.sae is not None and (p.sae.layer, p.sae.site) == (p.layer, p.site)
        assert p.permute is not None and (p.permute.layer, p.permute.site) == (p.layer, p.site)
        assert p.c1 is None and p.c2 is None  # the sweep decides nothing: the claims read its points
    assert sum(p.selection_frequency for p in res.points) == pytest.approx(1.0)
    assert res.c1 is None and res.c2 is None
    # issue 48: the plausible sites carry the sae stage's SAE seeds (sae.claim_seeds, 3 by default), the others one
    assert res.plausible_sites
    for p in res.points:
        assert p.sae is not None and p.permute is not None
        plausible = p.key in res.plausible_sites
        assert (p.sae.seed_pool is not None, p.permute.seed_pool is not None) == (plausible, plausible)
        if plausible:
            assert p.sae.seed_pool is not None and p.sae.seed_pool.seeds == [0, 1, 2]
            assert p.sae.n_row_features == p.n_row and p.sae.fvu == p.fvu  # the run seed's SAE, trained again
            assert (out / "stage" / p.key / "claim_seeds" / "seeds" / "seed2" / "sae.safetensors").is_file()
    for d in ("embed", "L0"):
        assert (out / "stage" / d / "sae.json").is_file() and not (out / "stage" / d / "acts").exists()
    again = exp.load(res.to_json())  # results.json round trip
    assert isinstance(again, SAELayersResult) and again.to_json() == res.to_json()


def test_the_curve_has_its_figure_section_and_claims(swept, tmp_path):
    from vitpos.claims.inputs import ClaimInputs
    from vitpos.claims.summary import summarise
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES

    exp, res, _ = swept
    for fig in exp.figures(res):
        fig.plot(res, tmp_path / f"{fig.name}.png")
        assert (tmp_path / f"{fig.name}.png").read_bytes()[:4] == b"\x89PNG"
    html = BY_NAME["sae_layers"].section(res, CLAIM_RULES)
    assert "Plausible sites" in html and html.count("<tr>") == 1 + len(res.points)
    rows = html.split("<tr>")[2:]  # the embedding's row first, with its position budget column
    assert rows[0].startswith("<td>embed") and "position budget: all positional" in html
    s = summarise({"m": ClaimInputs(sae_layers=res)})
    for c in s.claims:
        if c.id in ("C1", "C2"):
            nums = c.numbers["m"]
            assert nums["plausible_sites"] == res.plausible_sites and nums["single_layer"] is None
            assert nums["result"] in ("holds", "fails", "inconclusive")
            assert set(nums["per_site_result"]) == {"embed", "L0", "L1"}
            (cond,) = c.conditions["m"]  # over the curve: one condition, the rule at every plausible layer
            assert cond.name == "plausible_layers" and cond.outcome == nums["result"]


def test_quick_runs_turn_the_stage_off_and_other_models_do_not_take_it():
    exp = BY_NAME["sae_layers"]
    quick = load_config(None, {}, quick=True)
    assert quick.section("sae_layers").enabled is False and "--quick" in (exp.disabled(quick) or "")
    assert exp.disabled(load_config(None, {}, quick=False)) is None
    assert "absolute position" in (exp.applies_to(tiny_own("rope-axial")) or "")
    assert exp.applies_to(tiny_own("ape")) is None


def test_the_plan_lists_it_as_not_applicable_under_quick(tmp_path):
    from vitpos.study.run import plan_study

    cfg = load_config(None, {"models": ["builtin:ape"]}, quick=True)
    rows = {s.stage: s for s in plan_study(tmp_path, cfg, quick=True, measure=None).stages}
    assert rows["sae_layers"].status == "n/a" and "--quick" in rows["sae_layers"].note


def test_default_sizes_and_deeper_models_take_the_documented_subset():
    from vitpos.experiments.sae_sweep import sweep_layers

    exp = BY_NAME["sae_layers"]
    ape = tiny_own("ape")
    settings = exp.stage_settings(RunConfig.model_validate({}), ape, {}, False)
    assert settings.layers == sweep_layers(ape.depth) == [0]
    assert sweep_layers(12) == [0, 1, 3, 4, 6, 7, 9, 10]  # DINOv2-S/14: 8 evenly spaced of 0..10
    assert sweep_layers(6) == [0, 1, 2, 3, 4]  # the zoo's depth 6: every layer but the last


def test_each_layer_takes_the_sae_stages_high_norm_rule(tmp_path):
    """`sae.high_norm` (DINOv2's artifact-token rule) reaches every swept layer's SAE; a run without it keeps
    settings without the key (its cache keys unchanged)."""
    from vitpos.io import read_json

    exp, s = BY_NAME["sae_layers"], tiny_own("ape")
    plain = exp.stage_settings(RunConfig.model_validate({"sae_layers": SMALL}), s, {}, False)
    assert "high_norm" not in plain.model_dump(mode="json")  # the cache key
    settings = exp.stage_settings(RunConfig.model_validate({"sae_layers": SMALL, "sae": {"high_norm": 2.5}}), s, {},
                                  False)
    assert settings.model_dump(mode="json") == {**plain.model_dump(mode="json"), "high_norm": 2.5}
    stage = StageInput(data=toy_set(300), seed=0, settings=settings, prior={}, out=tmp_path / "stage",
                       progress=False, quick=False, root=tmp_path)
    res = exp.run_stage(s, stage)
    assert res.sae_high_norm == 2.5
    for key in res.sites:  # the embedding's SAE too
        training = read_json(tmp_path / "stage" / key / "sae.json")["training"]
        assert training["high_norm_factor"] == 2.5 and training["high_norm_threshold"] is not None
