"""`vitpos run --plan`: each experiment's StagePlan equals what its stage really computes, counted
with hooks (images through the patch embedding, image x block evaluations, probe fits)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from conftest import tiny_own
from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.experiments.ape_permute import ApePermuteStageSettings, plan_ape_permute, run_ape_permute
from vitpos.experiments.base import Done, SplitSizes, StageInput, StagePlan, probe_train_tokens
from vitpos.experiments.common import SAESite
from vitpos.experiments.extrapolate import ExtrapolateSettings, plan_extrapolate, run_extrapolate
from vitpos.experiments.registry import BY_NAME
from vitpos.experiments.rope_axis import RopeAxisSettings, plan_rope_axis, run_rope_axis
from vitpos.experiments.rope_freq import RopeFreqSettings, plan_rope_freq, run_rope_freq
from vitpos.experiments.rope_heads import run_rope_heads
from vitpos.experiments.rope_heads_plan import RopeHeadsSettings, plan_rope_heads
from vitpos.experiments.rope_prefix import RopePrefixSettings, plan_rope_prefix, run_rope_prefix
from vitpos.results.ape_permute import SEED_VARIANTS, ApePermuteResult
from vitpos.results.base import Skipped
from vitpos.results.sae_run import SAEResult
from vitpos.study.config import RunConfig
from vitpos.study.plan import Throughput, measure_throughput

INFO = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3)


def toy(n: int, seed: int = 0) -> TensorImageDataset:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 16, 16), generator=g, dtype=torch.uint8)
    return TensorImageDataset(images, torch.randint(0, 4, (n,), generator=g), INFO, "test")


@contextmanager
def counting(surface, monkeypatch):
    """Count what really runs: embedded images, image x block evaluations, probe fits and their work."""
    import vitpos.analysis.probes as probes_mod
    import vitpos.experiments.common as common
    import vitpos.experiments.extrapolate as extra_mod
    import vitpos.experiments.probe as probe_mod
    import vitpos.experiments.sae_causal as sae_mod

    seen = StagePlan()
    counts = {"forwards": 0, "blocks": 0, "fits": 0, "fit_work": 0}
    real_fit, real_fit_tokens = probes_mod.fit_position_probes, probes_mod.fit_probe_tokens

    def counted(real):
        def fit(*args, **kw):
            res = real(*args, **kw)
            heads = 2 * len(set(kw.get("l2_grid", probes_mod.DEFAULT_L2_GRID))) + (4 if kw.get("control", True) else 2)
            counts["fits"] += 1
            counts["fit_work"] += heads * res.n_train_tokens
            return res
        return fit

    # fits on full features, and fits on what a bounded capture kept (fit_position_probes calls
    # probes' own fit_probe_tokens, which stays unpatched: one count per fit)
    for mod in (probes_mod, probe_mod):
        monkeypatch.setattr(mod, "fit_position_probes", counted(real_fit))
    for mod in (common, sae_mod, extra_mod):
        monkeypatch.setattr(mod, "fit_probe_tokens", counted(real_fit_tokens))
    # hooks on the model: a resized copy (ModelSurface.at_size, a deepcopy) carries them, so its work counts too
    handles = [surface.model.patch_embed.register_forward_hook(
        lambda m, a, out: counts.__setitem__("forwards", counts["forwards"] + a[0].shape[0]))]
    for blk in surface.model.blocks:
        handles.append(blk.register_forward_pre_hook(
            lambda m, a: counts.__setitem__("blocks", counts["blocks"] + a[0].shape[0])))
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()
    del seen


def assert_counts(plan: StagePlan, counts: dict, exact_work: bool = False):
    assert (plan.forwards, plan.blocks, plan.fits) == (counts["forwards"], counts["blocks"], counts["fits"])
    # refits search the baseline's row and column L2s: 2 values planned, 1 when they agree
    assert counts["fit_work"] <= plan.fit_work if not exact_work else counts["fit_work"] == plan.fit_work
    assert plan.fit_work <= 2 * counts["fit_work"]


@pytest.fixture
def rope4():
    from conftest import TINY
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface

    torch.manual_seed(0)
    cfg = OwnViTConfig(pe="rope-mixed", **{**TINY, "depth": 4})
    return OwnSurface(build_own_vit(cfg).eval(), "tiny:rope-mixed4", cfg)


@pytest.mark.parametrize("shared", [True, False])
def test_rope_axis_plan_counts_what_runs(rope4, monkeypatch, shared):
    data = toy(300)
    for restore, readout in ((None, 0), ([2, 3], 24)):
        settings = RopeAxisSettings(images=280, restore=restore, readout_images=readout)
        plan = plan_rope_axis(settings, rope4, SplitSizes(test=300), shared_prefix=shared)
        with counting(rope4, monkeypatch) as counts:
            run_rope_axis(rope4, data, n_images=280, restore_points=restore, shared_prefix=shared,
                          readout_images=readout)
        assert_counts(plan, counts)


@pytest.mark.parametrize("shared", [True, False])
def test_rope_heads_plan_counts_what_runs(rope4, monkeypatch, shared):
    data = toy(300)
    for axis, restore_from, sweep in (("both", None, None), ("col", 1, [1, 3])):
        settings = RopeHeadsSettings(axis=axis, restore_from=restore_from, probe_images=40, top1_images=290,
                                     attn_images=6, sweep_restore=sweep, top1_screen_images=None,
                                     c5_ablation_heads=None)
        plan = plan_rope_heads(settings, rope4, SplitSizes(test=300), shared_prefix=shared)
        with counting(rope4, monkeypatch) as counts:
            run_rope_heads(rope4, data, axis=axis, restore_from=restore_from, n_probe_images=40, n_top1_images=290,
                           n_attn_images=6, shared_prefix=shared, sweep_restore=sweep)
        assert_counts(plan, counts)


@pytest.mark.parametrize("shared", [True, False])
def test_rope_prefix_plan_counts_what_runs(rope4, monkeypatch, shared):
    data = toy(300)
    for restore_from, block_from in ((None, 0), (1, 3), (3, 1), (2, 2)):
        settings = RopePrefixSettings(images=60, restore_from=restore_from, block_from=block_from, attn_images=5)
        plan = plan_rope_prefix(settings, rope4, SplitSizes(test=300), shared_prefix=shared)
        with counting(rope4, monkeypatch) as counts:
            run_rope_prefix(rope4, data, n_images=60, restore_from=restore_from, block_from=block_from,
                            n_attn_images=5, shared_prefix=shared)
        assert_counts(plan, counts)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("layer,site", [(0, "resid_post"), (1, "resid_pre"), (0, "mlp_out")])
def test_ape_permute_plan_counts_what_runs(monkeypatch, shared, layer, site):
    """Every variant has features and a full control here, so the upper bound is exact."""
    from vitpos.sae import SAE, SAEConfig

    ape = tiny_own("ape")
    torch.manual_seed(0)
    sae = SAE(SAEConfig.model_validate({"d_in": ape.width, "expansion": 4, "k": 64})).eval()
    doc = {"layer": layer, "site": site, "row_features": [1, 2], "col_features": [3], "mixed_features": [4],
           "conj_features": [5]}  # issue 47 item 3: the conjunction variants run too
    settings = ApePermuteStageSettings(images=40, seeds=2, sae=SAESite(layer=layer, site=site))
    plan = plan_ape_permute(settings, ape, SplitSizes(test=300), shared_prefix=shared)
    with counting(ape, monkeypatch) as counts:
        res = run_ape_permute(ape, sae, doc, data=toy(300), n_images=40, seeds=(0, 1), shared_prefix=shared)
    assert not any("skipped" in v for v in json.loads(res.model_dump_json()).values() if isinstance(v, dict))
    assert (counts["forwards"], counts["blocks"]) == (plan.forwards, plan.blocks)


@pytest.mark.parametrize("shared", [True, False])
def test_rope_freq_plan_counts_what_runs(rope4, monkeypatch, shared):
    data = toy(300)
    cases = ((None, None, 3), ([(0, 1), (0, 3), (1, 4), (1, 2), (3, 4)], None, 2), ([(2, 4)], [1, 3], 2))
    for windows, layers, bands in cases:
        settings = RopeFreqSettings(images=40, bands=bands, windows=windows, layers=layers)
        plan = plan_rope_freq(settings, rope4, SplitSizes(test=300), shared_prefix=shared)
        with counting(rope4, monkeypatch) as counts:
            run_rope_freq(rope4, data, n_images=40, bands=bands, windows=windows, layers=layers,
                          shared_prefix=shared)
        assert_counts(plan, counts)


def test_extrapolate_plan_counts_what_runs(rope4, monkeypatch):
    data = toy(300)
    for scales in (None, [1.5, 2.0, 3.0]):
        plan = plan_extrapolate(ExtrapolateSettings(images=50, scales=scales), rope4, SplitSizes(test=300))
        with counting(rope4, monkeypatch) as counts:
            run_extrapolate(rope4, data, n_images=50, scales=scales)
        assert_counts(plan, counts, exact_work=True)
        assert plan.forwards == 50 * (1 + len(scales or rope4.extrapolation_scales))


def test_shared_prefix_plans_fewer_blocks_and_fits(rope4):
    sizes = SplitSizes(test=4000)
    heads = RopeHeadsSettings(axis="both", restore_from=None, probe_images=500, top1_images=2000, attn_images=64,
                              top1_screen_images=None, c5_ablation_heads=None)
    prefix = RopePrefixSettings(images=500, restore_from=None, block_from=0, attn_images=64)
    freq = RopeFreqSettings(images=300, bands=3, windows=None, layers=None)
    axis = RopeAxisSettings(images=1000, restore=None, readout_images=0)
    for fn, settings in ((plan_rope_heads, heads), (plan_rope_axis, axis), (plan_rope_prefix, prefix),
                         (plan_rope_freq, freq)):
        new, old = fn(settings, rope4, sizes), fn(settings, rope4, sizes, shared_prefix=False)
        assert new.blocks < old.blocks and new.fits < old.fits and new.forwards < old.forwards


def _stage(exp_name, surface, data, cfg, prior, tmp_path):
    exp = BY_NAME[exp_name]
    settings = exp.stage_settings(cfg, surface, prior, False)
    stage = StageInput(data=data, seed=0, settings=settings, prior=prior, out=tmp_path / exp_name, progress=False,
                       quick=False)
    return exp, settings, stage


def test_every_stage_plan_counts_what_runs(monkeypatch, tmp_path):
    """eval, probe, sae, ape_permute and extrapolate on an APE model; the RoPE stages and extrapolate on a
    RoPE model, through the study's settings."""
    cfg = RunConfig.model_validate({
        "eval_images": 50, "probe": {"images": 40},
        "sae": {"images": 300, "eval_images": 30, "epochs": 1, "expansion": 2, "k": 4, "layer": 0, "claim_seeds": 1},
        "ape_permute": {"images": 20, "seeds": 1},
        "rope_axis": {"images": 30, "restore": [1]},
        "rope_heads": {"probe_images": 30, "top1_images": 20, "attn_images": 4},
        "rope_prefix": {"images": 30, "attn_images": 4, "block_from": 1},
        "rope_freq": {"images": 30, "bands": 2}, "extrapolate": {"images": 24}})
    data = toy(300)
    sizes = SplitSizes(train=300, test=300)
    ape = tiny_own("ape")
    prior: dict[str, Done] = {}
    for name in ("eval", "probe", "sae", "ape_permute", "extrapolate"):
        exp, settings, stage = _stage(name, ape, data, cfg, prior, tmp_path)
        plan = exp.plan(settings, ape, sizes)
        with counting(ape, monkeypatch) as counts:
            result = exp.run_stage(ape, stage)
        prior[name] = Done(result, settings)
        if name == "ape_permute":  # variants without features are skipped: the plan is an upper bound
            skipped = sum("skipped" in v for v in json.loads(result.model_dump_json()).values() if isinstance(v, dict))
            assert counts["forwards"] == plan.forwards  # SAE variants run from the shared stream after layer 0
            assert counts["blocks"] == plan.blocks - skipped * 20 * (ape.depth - 1)
            assert counts["fits"] == plan.fits == 0
        elif name == "sae":
            causal = result.causal
            # each set without features skips its ablation pass, each set without a control its control pass
            missing = 0 if causal is None else sum(
                x is None for k in ("row", "col") for x in (causal.effect(k), causal.control(k)))
            # the browser's heatmap pass runs only the images that won a top-k slot (each has a thumbnail)
            page = (Path(result.sae_dir) / "browse" / "index.html").read_text()
            data_json = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
            unused = 30 - len(data_json["img"])
            assert counts["forwards"] == plan.forwards - missing * 30 - unused
            assert counts["blocks"] == plan.blocks - missing * 30 * ape.depth - unused * (settings.layer + 1)
            assert counts["fits"] == plan.fits
            assert plan.sae_tokens == 300 * ape.num_patches * 2  # and the seed-stability SAE's
        else:
            assert_counts(plan, counts, exact_work=True)
    rope = tiny_own("rope-axial")
    for name in ("rope_axis", "rope_heads", "rope_prefix", "rope_freq", "extrapolate"):
        exp, settings, stage = _stage(name, rope, data, cfg, {}, tmp_path)
        plan = exp.plan(settings, rope, sizes)
        with counting(rope, monkeypatch) as counts:
            exp.run_stage(rope, stage)
        assert_counts(plan, counts)


def test_split_sizes_cap_the_counts():
    sizes = SplitSizes(train=None, test=100)
    assert sizes.n("test", 500) == 100 and sizes.n("test", None) == 100 and sizes.n("train", 7) == 7
    with pytest.raises(ValueError):
        sizes.n("train", None)
    assert probe_train_tokens(100, 64, 8000) == 75 * 64  # under the cap: every token
    assert probe_train_tokens(200, 64, 8000) == 150 * 53  # capped, position-balanced: whole tokens per image
    assert probe_train_tokens(10, 64, None) == 8 * 64


def test_plan_summary_and_time_estimate():
    tp = Throughput("cpu", embed_s=1e-3, block_s=1e-3, fit_work_s=1e-6, sae_token_s_per_latent=1e-9)
    plan = StagePlan(forwards=10, blocks=100, fits=2, fit_work=1000, sae_tokens=10, sae_work=1000)
    assert tp.seconds(plan) == pytest.approx(0.01 + 0.1 + 0.001 + 1e-6)
    assert (plan + plan).blocks == 200


def test_measure_throughput_is_positive():
    tp = measure_throughput(tiny_own("rope-mixed"), images=2, repeats=1)
    assert tp.block_s > 0 and tp.embed_s > 0 and tp.fit_work_s > 0 and tp.sae_token_s_per_latent > 0
    assert 0 < tp.cpu_share <= 1


def test_a_timing_taken_on_a_busy_cpu_is_said_to_be():
    """The estimate is only as good as the timing: when the timed process got a small share of its
    threads' time (other work on the CPU), the plan line says so; an idle timing adds nothing."""
    from vitpos.study.plan import PlannedStage, StudyPlan

    def summary(share: float) -> str:
        tp = Throughput("cpu", embed_s=1e-3, block_s=1e-3, fit_work_s=1e-6, sae_token_s_per_latent=1e-9,
                        cpu_share=share)
        stage = PlannedStage("m", "shapes", "eval", StagePlan(forwards=10, blocks=60), "run", seconds=0.07)
        return StudyPlan(stages=[stage], throughput={"m": tp}).summary()

    assert "busy CPU" not in summary(0.95)
    assert "timed on a busy CPU (this process got 12% of its threads' time)" in summary(0.12)


def test_the_first_and_starved_timings_are_retaken_and_the_faster_kept(tmp_path):
    """A cold first timing (README command 1 right after the install: 10x slower than the twins') and a
    starved one are timed again after the others; the faster of the two is what the estimate uses."""
    from conftest import TIMM_TINY
    from vitpos.study.run import plan_study

    specs = [TIMM_TINY["vit"], TIMM_TINY["deit3"], TIMM_TINY["vit_reg"]]
    calls: list[str] = []

    def measure(surface):
        calls.append(surface.spec)
        first_time = calls.count(surface.spec) == 1
        slow = first_time and surface.spec in (specs[0], specs[2])  # cold first model; a starved third
        share = 0.3 if first_time and surface.spec == specs[2] else 1.0
        return Throughput("cpu", embed_s=1e-4, block_s=1e-2 if slow else 1e-3, fit_work_s=1e-7,
                          sae_token_s_per_latent=1e-9, cpu_share=share)

    cfg = RunConfig.model_validate({"models": specs, "data": ["shapes"], "sae_layers": {"enabled": False}})
    plan = plan_study(tmp_path / "out", cfg, quick=True, measure=measure)
    assert calls == [*specs, specs[0], specs[2]]  # the second model is timed once
    assert {tp.block_s for tp in plan.throughput.values()} == {1e-3}
    assert all(s.seconds is None or s.seconds < 1e3 for s in plan.stages)


def test_a_runner_with_every_stage_cached_gets_no_throughput(tmp_path):
    """One model on two data sets, one runner's stages all cached: the model is timed once, for the
    runner with stages to run, and only that runner gets a throughput and seconds."""
    from types import SimpleNamespace

    from vitpos.study.cache import StageCache
    from vitpos.study.plan import PlannedStage
    from vitpos.study.run import _plan

    work = StagePlan(forwards=10, blocks=60)

    def runner(data: str, status: str):
        return SimpleNamespace(spec="m", key_spec=f"m@{data}", data=data, surface=object(),
                               data_problem=lambda: None,
                               plan_all=lambda: [PlannedStage(f"m@{data}", data, "eval", work, status)])

    calls = []

    def measure(surface):
        calls.append(surface)
        return Throughput("cpu", embed_s=1e-4, block_s=1e-3, fit_work_s=1e-7, sae_token_s_per_latent=1e-9)

    plan = _plan([runner("shapes", "cached"), runner("pairs", "run")], measure,  # type: ignore[list-item]
                 StageCache(tmp_path, False))
    assert set(plan.throughput) == {"m@pairs"}
    assert [s.seconds is not None for s in plan.stages] == [False, True]
    assert len(calls) == 2  # timed, then retaken (the first model timed): the same model only


def test_a_version_bump_recomputes_exactly_that_experiments_stages(tmp_path, monkeypatch, capsys):
    """Run a tiny APE study, then bump one experiment's version: `vitpos run --plan` on the cached DIR
    shows that experiment's stage (and those that read its result) to run, every other stage cached."""
    from conftest import TIMM_TINY
    from vitpos.cli import main
    from vitpos.experiments.registry import stage_versions
    from vitpos.study.run import plan_study, run_study

    spec = TIMM_TINY["vit"].replace("img_size=16", "img_size=32")
    doc = {"models": [spec], "data": ["shapes"], "eval_images": 16, "probe": {"images": 16},
           "sae": {"images": 64, "eval_images": 16, "epochs": 1, "expansion": 1},
           "ape_permute": {"images": 8, "seeds": 1}, "extrapolate": {"images": 8},
           "sae_layers": {"enabled": False}}  # the sweep has its own test (test_sae_layers.py)
    config = tmp_path / "run.yaml"  # JSON is YAML
    config.write_text(json.dumps(doc))
    cfg = RunConfig.model_validate(doc)
    run_study(tmp_path / "out", cfg, progress=False, log=lambda m: None, measure=None)
    stages = ["eval", "probe", "sae", "ape_permute", "extrapolate"]

    def to_run() -> list[str]:
        return [s.stage for s in plan_study(tmp_path / "out", cfg, measure=None).stages if s.status == "run"]

    assert to_run() == []
    declared = {n: BY_NAME[n].version for n in ("ape_permute", "probe", "sae", "eval")}
    assert stage_versions(BY_NAME["ape_permute"]) == {n: declared[n] for n in ("ape_permute", "probe", "sae")}
    monkeypatch.setattr(type(BY_NAME["eval"]), "version", declared["eval"] + 1)
    assert to_run() == ["eval"]
    main(["run", "--plan", "--config", str(config), "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith(spec)}
    assert set(stages) <= set(rows) and all("n/a" in rows[s] for s in set(rows) - set(stages))
    assert [s for s in stages if rows[s].rstrip().endswith("cached")] == ["probe", "sae", "ape_permute", "extrapolate"]
    assert "plan: 1 model(s), 1 stage(s) to run, 4 cached" in text
    monkeypatch.setattr(type(BY_NAME["eval"]), "version", declared["eval"])
    monkeypatch.setattr(type(BY_NAME["sae"]), "version", declared["sae"] + 1)  # ape_permute reads the SAE: it follows
    assert to_run() == ["sae", "ape_permute"]


def test_the_extra_sae_seeds_are_counted_in_the_sae_and_ape_permute_plans(monkeypatch, tmp_path):
    """sae.claim_seeds = 3 (issue 48): the sae stage trains seed 2 beside the stability SAE (seed 1, reused),
    and each extra seed's held-out capture, removals and probe refits are counted; ape_permute counts each
    extra seed's permutation of SEED_VARIANTS. Upper bounds less what the run skipped, as above."""
    cfg = RunConfig.model_validate({
        "probe": {"images": 40}, "ape_permute": {"images": 20, "seeds": 1},
        "sae": {"images": 300, "eval_images": 30, "epochs": 1, "expansion": 2, "k": 4, "layer": 0, "claim_seeds": 3,
                "browse": False}})
    data, sizes, ape = toy(300), SplitSizes(train=300, test=300), tiny_own("ape")
    prior: dict[str, Done] = {}
    for name in ("probe", "sae", "ape_permute"):
        exp, settings, stage = _stage(name, ape, data, cfg, prior, tmp_path)
        plan = exp.plan(settings, ape, sizes)
        with counting(ape, monkeypatch) as counts:
            result = exp.run_stage(ape, stage)
        prior[name] = Done(result, settings)
        if name == "sae":
            assert isinstance(result, SAEResult) and result.seed_pool is not None
            assert result.seed_pool.seeds == [0, 1, 2] and [r.seed for r in result.seed_pool.runs] == [1, 2]
            checks = [result.causal, *(r.causal for r in result.seed_pool.runs)]
            missing = sum(x is None for c in checks if c is not None for k in ("row", "col")
                          for x in (c.effect(k), c.control(k)))
            assert counts["forwards"] == plan.forwards - missing * 30
            assert counts["blocks"] == plan.blocks - missing * 30 * ape.depth
            assert counts["fits"] == plan.fits
            assert plan.sae_tokens == 300 * ape.num_patches * 3  # the run seed's, the stability (seed 1) and seed 2
            assert "2 extra SAE seed(s)" in plan.note
        elif name == "ape_permute":
            assert isinstance(result, ApePermuteResult) and result.seed_pool is not None
            skipped = sum("skipped" in v for v in json.loads(result.model_dump_json()).values() if isinstance(v, dict))
            pooled = result.seed_pool.variants
            skipped += sum(n == 0 for v in SEED_VARIANTS for n in pooled[v].per_seed_n_features[1:])
            assert counts["forwards"] == plan.forwards
            assert counts["blocks"] == plan.blocks - skipped * 20 * (ape.depth - 1)


def test_sae_layers_plan_counts_what_runs(monkeypatch, tmp_path):
    """The layer sweep's plan: per swept layer the sae stage's count of run_sae (no browser, no stability
    SAE) and ape_permute's on each half of the permutation images (half A: the all-positional permutation
    that selects; half B: every variant), less what the run skipped (a feature set without features skips its
    causal removal and its control; a permutation variant without features its blocks after the layer)."""
    from conftest import TINY
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface

    torch.manual_seed(0)
    c = OwnViTConfig(pe="ape", **{**TINY, "depth": 3})
    ape = OwnSurface(build_own_vit(c).eval(), "tiny:ape3", c)
    torch.manual_seed(1)
    with torch.no_grad():  # predictions that vary from image to image
        for p in ape.model.parameters():
            p.normal_(0, 0.3)
    cfg = RunConfig.model_validate({"sae_layers": {"images": 300, "eval_images": 30, "epochs": 1, "expansion": 2,
                                                   "k": 4, "permute_images": 20, "seeds": 1},
                                    "sae": {"claim_seeds": 1}})  # one SAE seed per site (see the test below)
    exp, settings, stage = _stage("sae_layers", ape, toy(300), cfg, {}, tmp_path)
    assert settings.layers == [0, 1]
    plan = exp.plan(settings, ape, SplitSizes(train=300, test=300))
    with counting(ape, monkeypatch) as counts:
        result = exp.run_stage(ape, stage)
    L = ape.depth
    missing = skipped_blocks = 0
    for p in result.points:
        assert p.sae is not None and p.permute is not None
        causal = p.sae.causal
        missing += 0 if causal is None else sum(x is None for k in ("row", "col")
                                                for x in (causal.effect(k), causal.control(k)))
        skipped = sum(isinstance(p.permute.outcome(v), Skipped) for v in p.permute.variant_names())
        resume = p.layer + (1 if p.site == "resid_post" else 0)  # the embedding's runs go through every block
        # half B (10 of the 20 images) runs every variant; half A (the other 10) the all-positional one only
        skipped_blocks += (skipped + (p.selection_drop is None)) * 10 * (L - resume)
    assert result.held_out is not None and len(result.held_out.selection) == len(result.held_out.verdict) == 10
    assert [p.key for p in result.points] == ["embed", "L0", "L1"]
    assert counts["forwards"] == plan.forwards - missing * 30
    assert counts["blocks"] == plan.blocks - missing * 30 * L - skipped_blocks
    assert counts["fits"] == plan.fits
    assert plan.sae_tokens == 3 * 300 * ape.num_patches  # one SAE per site (the embedding, 2 layers), one epoch


def test_a_starved_timing_goes_on_until_a_repeat_gets_the_cpu(monkeypatch):
    """The first 2 repeats run at a tenth of the CPU and 10x slower (a burst of other work): the timing
    does not stop at MIN_TIMING_S with the burst's throughput, it keeps the repeat that got the CPU."""
    import types

    import torch

    import vitpos.study.plan as plan

    class Clock:  # perf_counter: t0, t1, t2 of each repeat; process time charged with each block run
        def __init__(self, starved: int):
            self.calls, self.t, self.c, self.starved = 0, 0.0, 0.0, starved

        def perf_counter(self) -> float:
            repeat, pos = divmod(self.calls, 3)
            self.calls += 1
            if pos == 2:
                busy = repeat < self.starved
                wall = 1.0 if busy else 0.1
                self.t += wall
                self.c += wall * torch.get_num_threads() * (0.1 if busy else 1.0)
            else:
                self.t += 0.001
            return self.t

        def process_time(self) -> float:
            return self.c

    clock = Clock(starved=2)
    monkeypatch.setattr(plan, "time", types.SimpleNamespace(perf_counter=clock.perf_counter,
                                                            process_time=clock.process_time))
    monkeypatch.setattr(plan, "measure_fit", lambda surface: 1e-6)
    surface = tiny_own("rope-mixed")
    tp = plan.measure_throughput(surface, images=2, repeats=1)
    assert tp.cpu_share > 0.99 and abs(tp.block_s - 0.1 / (2 * surface.depth)) < 1e-9
    # on a CPU that stays busy it stops after MAX_BUSY_TIMING_S, saying so
    clock = Clock(starved=10**6)
    monkeypatch.setattr(plan, "time", types.SimpleNamespace(perf_counter=clock.perf_counter,
                                                            process_time=clock.process_time))
    tp = plan.measure_throughput(surface, images=2, repeats=1)
    assert tp.cpu_share < plan.BUSY_SHARE and clock.calls // 3 == 3


def test_ape_permute_plan_before_the_layer_is_chosen_bounds_every_layer():
    """The probes choose the SAE layer after the plan is made: the count must bound the stage at any
    layer (it was counted at depth // 2; DINOv2-S/14's permutation then chose layer 0 and took 2.3x)."""
    ape = tiny_own("ape")
    unknown = plan_ape_permute(ApePermuteStageSettings(images=40, seeds=2, sae=SAESite()), ape, SplitSizes(test=300))
    assert "counted at 0" in unknown.note
    for layer in range(ape.depth):
        known = plan_ape_permute(ApePermuteStageSettings(images=40, seeds=2, sae=SAESite(layer=layer)), ape,
                                 SplitSizes(test=300))
        assert known.blocks <= unknown.blocks and known.forwards <= unknown.forwards
