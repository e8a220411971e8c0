"""Partial forwards (ModelSurface.embed_tokens / run_blocks / forward_from) and the shared-prefix
sweeps built on them: equal to the full forward and to the old per-condition path."""

from __future__ import annotations

import pytest
import torch

from conftest import TIMM_TINY, images_for, tiny_own, tiny_surface
from vitpos.errors import VitposError
from vitpos.hooks import capture, edit, remove_rope, zero_ablate

OWN = ("ape", "rope-axial", "rope-mixed", "rope-ape", "none")


def _surfaces():
    return [pytest.param(("own", pe), id=f"own-{pe}") for pe in OWN] + [
        pytest.param(("timm", k), id=f"timm-{k}") for k in TIMM_TINY]


@pytest.mark.parametrize("which", _surfaces())
def test_forward_from_equals_the_full_forward_bit_for_bit(which):
    s = tiny_surface(which)
    x = images_for(s, 4)
    full = s(x)
    with capture(s, "resid_pre") as c:
        s(x)
    assert torch.equal(s.forward_from(0, s.embed_tokens(x)), full)
    for layer in range(s.depth):
        assert torch.equal(s.forward_from(layer, c[f"blocks.{layer}.resid_pre"]), full)
    t = s.embed_tokens(x)
    assert torch.equal(s.run_blocks(t, 0, 1), c["blocks.1.resid_pre"])
    assert torch.equal(s.run_blocks(t, 1, 1), t)
    assert torch.equal(s.forward_from(s.depth, s.run_blocks(t, 0)), full)


@pytest.mark.parametrize("which", _surfaces())
def test_hooks_on_later_blocks_act_in_partial_forwards(which):
    s = tiny_surface(which)
    x = images_for(s, 3)
    with capture(s, ["blocks.1.resid_pre"]) as c:
        s(x)
    start = c["blocks.1.resid_pre"]
    ctxs = [lambda: edit(s, {"blocks.1.attn_out": zero_ablate()})]
    if s.has_rope:
        ctxs.append(lambda: remove_rope(s, {"row": [0]}, layers=[1]))
        ctxs.append(lambda: remove_rope(s, {"row": None, "col": [1]}, layers=[1]))
    for make in ctxs:
        with make():
            want, got = s(x), s.forward_from(1, start)
        assert torch.equal(got, want)
        # capturing the pattern switches block 1 to unfused attention, in both paths alike
        with make(), capture(s, ["blocks.1.attn_pattern", "blocks.1.resid_post"]) as got_c:
            got = s.forward_from(1, start)
        with make(), capture(s, ["blocks.1.attn_pattern", "blocks.1.resid_post"]) as want_c:
            want = s(x)
        assert torch.equal(got, want)
        for key in ("blocks.1.attn_pattern", "blocks.1.resid_post"):
            assert torch.equal(got_c[key], want_c[key])
        assert not torch.equal(want, s(x))  # the edit did something


def test_partial_forwards_refuse_bad_inputs():
    s = tiny_own("rope-axial")
    t = s.embed_tokens(images_for(s, 2))
    with pytest.raises(VitposError, match="outside layers"):
        s.run_blocks(t, 1, s.depth + 1)
    with pytest.raises(VitposError, match="does not fit"):
        s.forward_from(0, t[:, 1:])


# --- the sweeps: shared prefix == the old path (every condition from the input) ---------------------

DEEP = 4  # depth of the equivalence models: restore points and layers before them to share


def _deep(which):
    from conftest import TINY
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface, load_model

    kind, name = which
    torch.manual_seed(0)
    if kind == "own":
        cfg = OwnViTConfig(pe=name, **{**TINY, "depth": DEEP})
        return OwnSurface(build_own_vit(cfg).eval(), f"tiny:{name}", cfg)
    return load_model(TIMM_TINY[name].replace("depth=2", f"depth={DEEP}"))


def _planted(which, n: int = 300):
    """A depth-4 RoPE model where rotations matter (sharp q/k, a strong attention output, a larger
    CLS token) on near-constant images labelled by the model itself, so probe accuracies, recovery,
    axis indices and top-1 drops all move under the interventions; n = 300: two batches of 256 + 44."""
    from vitpos.data.base import DatasetInfo, TensorImageDataset

    s = _deep(which)
    with torch.no_grad():
        s.model.cls_token.mul_(3)
        for b in s.model.blocks:
            b.attn.qkv.weight[: 2 * s.width] *= 8
            b.attn.proj.weight.mul_(50)
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3,
                       class_groups={"ab": (0, 1), "cd": (2, 3)})
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 4, 4, generator=g).repeat(1, 4, 4) + 0.3 * torch.rand(n, 3, 16, 16, generator=g)).clamp(0, 1)
    images = (x * 255).to(torch.uint8)
    unlabelled = TensorImageDataset(images, torch.zeros(n, dtype=torch.long), info, "test")
    labels = torch.cat([s(b).argmax(-1) for b, _ in unlabelled.batches(256)])
    return s, TensorImageDataset(images, labels, info, "test")


def differences(want, got, path: str = "", tol: float = 1e-5) -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        if list(want) != list(got):
            return [f"{path}: keys {list(want)} != {list(got)}"]
        return [d for k in want for d in differences(want[k], got[k], f"{path}/{k}", tol)]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: length {len(want)} != {len(got)}"]
        pairs = enumerate(zip(want, got, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{path}[{i}]", tol)]
    if isinstance(want, float) and isinstance(got, float):
        same = (want != want and got != got) or abs(want - got) <= tol
        return [] if same else [f"{path}: {want!r} != {got!r}"]
    return [] if want == got and type(want) is type(got) else [f"{path}: {want!r} != {got!r}"]


ROPE_MODELS = [pytest.param(("own", "rope-axial"), id="own-rope-axial"),
               pytest.param(("own", "rope-mixed"), id="own-rope-mixed"),
               pytest.param(("timm", "rope_axial"), id="timm-vit_small_patch16_rope_224"),
               pytest.param(("timm", "rope_mixed"), id="timm-vit_small_patch16_rope_mixed_224")]


@pytest.mark.parametrize("which", ROPE_MODELS)
def test_rope_axis_shared_prefix_equals_the_old_path(which):
    from vitpos.experiments.rope_axis import run_rope_axis

    s, data = _planted(which)
    for restore in (None, [2, 3]):
        old = run_rope_axis(s, data, n_images=300, restore_points=restore, shared_prefix=False).to_json()
        new = run_rope_axis(s, data, n_images=300, restore_points=restore).to_json()
        diffs = differences(old, new)
        assert not diffs, diffs[:10]
        accs = [a for c in new["conditions"].values() for a in c["row_acc"] + c["col_acc"]]
        assert max(accs) - min(accs) > 0.2  # the conditions differ: the comparison has teeth
        for c in new["conditions"].values():  # every retrained accuracy and top-1 inside its interval
            assert c["top1_ci95"][0] - 1e-9 <= c["top1"] <= c["top1_ci95"][1] + 1e-9
            for a in ("row", "col"):
                for acc, (lo, hi) in zip(c[f"{a}_acc"], c[f"{a}_acc_ci95"], strict=True):
                    assert lo - 1e-9 <= acc <= hi + 1e-9
        recs = [r for per_axis in new["recovery"].values() for r in per_axis.values() if r["mean_rec"] is not None]
        assert recs and all(r["mean_rec_ci95"][0] - 1e-9 <= r["mean_rec"] <= r["mean_rec_ci95"][1] + 1e-9
                            for r in recs)
        # C3's fractions and C4's median Rec with their paired intervals (compared old vs new above too)
        for rem in new["removal"].values():
            for key in ("removed", "kept"):
                assert rem[f"{key}_ci95"][0] - 1e-9 <= rem[key] <= rem[f"{key}_ci95"][1] + 1e-9
        for a, med in new["median_recovery"].items():
            assert med["restore_points"] == [int(r) for r, v in new["recovery"][a].items() if v["mean_rec"] is not None]
            assert med["median_rec_ci95"][0] - 1e-9 <= med["median_rec"] <= med["median_rec_ci95"][1] + 1e-9


@pytest.mark.parametrize("which", ROPE_MODELS)
def test_rope_heads_shared_prefix_equals_the_old_path(which):
    from vitpos.experiments.rope_heads import run_rope_heads

    s, data = _planted(which)
    for axis, restore_from in (("both", 1), ("row", 2)):
        kw = dict(axis=axis, restore_from=restore_from, n_probe_images=300, n_top1_images=300, n_attn_images=8)
        old = run_rope_heads(s, data, shared_prefix=False, **kw).to_json()
        new = run_rope_heads(s, data, **kw).to_json()
        diffs = differences(old, new)
        assert not diffs, diffs[:10]
        scores = [v for row in new["rebuild_score"] for v in row if v is not None]
        assert len({round(v, 6) for v in scores}) > 2 and len({round(v, 6) for r in new["axis_index"] for v in r}) > 2
        if which == ("own", "rope-axial"):
            assert max(max(r) for r in new["drop_points"]) > 1  # top-1 moves too
        # the direct effect (iii): null before R, a number with an interval around it from R on
        for li, (row, cis) in enumerate(zip(new["direct_effect_score"], new["direct_effect_ci95"], strict=True)):
            for v, ci in zip(row, cis, strict=True):
                assert (v is None and ci is None) if li < restore_from else ci[0] - 1e-9 <= v <= ci[1] + 1e-9
        assert len({round(v, 6) for row in new["direct_effect_score"] for v in row if v is not None}) > 2
        assert set(new["top_heads"]) == {"rebuild", "mean_ablate", "direct_effect"}
        assert set(new["top_heads_agreement"]) == {"rebuild~mean_ablate", "rebuild~direct_effect",
                                                   "mean_ablate~direct_effect"}
        assert new["top_heads_agreement"]["rebuild~mean_ablate"] == new["top_heads_overlap"]
        for srow, crow in zip(new["axis_index"], new["axis_index_ci95"], strict=True):  # S inside its interval
            assert all(lo - 1e-9 <= v <= hi + 1e-9 for v, (lo, hi) in zip(srow, crow, strict=True))
        lo, hi = new["recovery_restore_ci95"]
        assert lo - 1e-9 <= new["recovery_restore"] <= hi + 1e-9
        for key in ("rebuild_score", "mean_ablate_score"):  # paired intervals around each head's fall
            for row, cis in zip(new[key], new[f"{key}_ci95"], strict=True):
                for v, ci in zip(row, cis, strict=True):
                    assert (ci is None) if v is None else ci[0] - 1e-9 <= v <= ci[1] + 1e-9


def test_differences_sees_a_changed_number():
    assert differences({"a": [1.0]}, {"a": [1.0 + 2e-5]}) == ["/a[0]: 1.0 != 1.00002"]
    assert differences({"a": 1.0}, {"a": 1.0 + 1e-6}) == []


def test_forward_from_and_head_drops_through_an_attached_head():
    """A headless RoPE backbone with a fitted head (`with_head`): partial forwards end in the head
    as __call__ does, and the per-head top-1 drops equal the old path's."""
    from vitpos.analysis.heads import fit_head
    from vitpos.data.resolve import dataset_for
    from vitpos.experiments.rope_heads_ablation import head_drops
    from vitpos.models.spec import load_model

    torch.manual_seed(0)
    spec = TIMM_TINY["rope_mixed"].replace("img_size=16", "img_size=32").replace("num_classes=4", "num_classes=0")
    base = load_model(spec)
    s = base.with_head(fit_head(base, "shapes", n_images=16, n_val_images=8, n_test_images=8))
    data = dataset_for(s, "shapes", "test", limit=20)
    x = next(iter(data.batches(20)))[0]
    assert torch.equal(s.forward_from(0, s.embed_tokens(x)), s(x))
    assert s(x).shape == (20, 4)
    shared, full = head_drops(s, data, shared_prefix=True), head_drops(s, data, shared_prefix=False)
    assert torch.equal(shared.clean, full.clean) and torch.equal(shared.ablated, full.ablated)
    assert shared.ablated.shape == (s.depth, s.num_heads, 20)


def test_sweep_batch_is_a_patch_token_budget():
    from types import SimpleNamespace

    from vitpos.experiments.common import BATCH, sweep_batch

    def grid(n: int):
        return SimpleNamespace(num_patches=n)

    assert sweep_batch(grid(16)) == sweep_batch(grid(64)) == BATCH  # the shipped 8x8 models: unchanged
    assert sweep_batch(grid(196)) == 83  # ViT-S/16 at 224 px
    assert sweep_batch(grid(256)) == 64  # ViT-S/14 at 224 px
    assert sweep_batch(grid(100_000)) == 8  # never fewer than 8 images
    assert sweep_batch(grid(196), 5) == 5  # an explicit batch wins
    for n in (65, 196, 256, 1024):
        assert sweep_batch(grid(n)) * n <= BATCH * 64  # never more patch tokens per forward than on 8x8


@pytest.mark.parametrize("which", ROPE_MODELS[:1])
def test_rope_axis_numbers_do_not_depend_on_the_batch(which):
    """sweep_batch changes the images per forward on large grids: the numbers must not move."""
    from vitpos.experiments.rope_axis import run_rope_axis

    s, data = _planted(which)
    whole = run_rope_axis(s, data, n_images=300, restore_points=[2]).to_json()
    small = run_rope_axis(s, data, n_images=300, restore_points=[2], batch_size=37).to_json()
    diffs = differences(whole, small)
    assert not diffs, diffs[:10]


def test_in_the_race_keeps_the_leader_its_rivals_and_the_primary():
    from vitpos.experiments.rope_heads_ablation import HeadDrops, in_the_race

    n = 400
    clean = torch.ones(n, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    # 1 x 4 heads: ablated correct with prob 0.5 (leader), 0.52 (rival), 0.95 and 1.0 (far behind)
    ablated = torch.stack([torch.rand(n, generator=g) >= p for p in (0.5, 0.48, 0.05, 0.0)]).reshape(1, 4, n)
    drops = HeadDrops(clean, ablated)
    assert in_the_race(drops) == {(0, 0), (0, 1)}
    assert in_the_race(drops, keep=[(0, 3)]) == {(0, 0), (0, 1), (0, 3)}


def test_adaptive_top1_is_the_full_sweep_cut_short():
    """With a screen, a head out of the race keeps exactly the full sweep's screen images, a head in
    it every image; the race is decided on the screen alone; both paths agree."""
    from vitpos.experiments.rope_heads_ablation import HeadDrops, head_drops, in_the_race

    s, data = _planted(("own", "rope-axial"))  # the planted model whose heads' drops differ
    full = head_drops(s, data, batch_size=50)
    primary = (s.depth - 1, 0)
    for shared in (True, False):
        ad = head_drops(s, data, shared, batch_size=50, screen=90, keep=[primary])  # whole batches: 100 images
        counts = ad.counts()
        race = {(li, h) for li, row in enumerate(counts) for h, m in enumerate(row) if m == 300}
        assert {m for row in counts for m in row} == {100, 300}  # some heads left the race: the test has teeth
        assert race == in_the_race(HeadDrops(full.clean[:100], full.ablated[..., :100]), [primary])
        assert primary in race
        assert torch.equal(ad.clean, full.clean)
        for li, row in enumerate(counts):
            for h, m in enumerate(row):
                assert torch.equal(ad.ablated[li, h, :m], full.ablated[li, h, :m])
        cut = HeadDrops(full.clean, full.ablated, torch.tensor(counts))
        assert ad.drops() == cut.drops() and ad.drop_intervals() == cut.drop_intervals()
        for li, row in enumerate(ad.drops()):
            for h, d in enumerate(row):
                m = counts[li][h]
                want = 100.0 * (float(full.clean[:m].float().mean()) - float(full.ablated[li, h, :m].float().mean()))
                assert d == want
        margins = ad.margin_intervals(primary)
        assert margins[primary[0]][primary[1]] is None
    no_screen = head_drops(s, data, batch_size=50, screen=300)  # a screen of every image: the full sweep
    assert no_screen.measured is None and torch.equal(no_screen.ablated, full.ablated)


def test_rope_heads_adaptive_top1_results_agree_across_paths():
    from vitpos.experiments.rope_heads import run_rope_heads

    s, data = _planted(("own", "rope-axial"))
    kw = dict(restore_from=2, n_probe_images=300, n_top1_images=300, n_attn_images=8, top1_screen=100)
    old = run_rope_heads(s, data, shared_prefix=False, **kw).to_json()
    new = run_rope_heads(s, data, **kw).to_json()
    assert not differences(old, new)
    assert new["top1_screen_images"] == 256  # whole batches of the study's 256
    counts = [m for row in new["top1_images_per_head"] for m in row]
    assert set(counts) <= {256, 300} and 300 in counts
    p = new["primary_rebuilding_head"]
    assert new["top1_images_per_head"][p[0]][p[1]] == 300  # the primary always stays in the race
    full = run_rope_heads(s, data, **{**kw, "top1_screen": None}).to_json()
    assert full["top1_screen_images"] is None and full["top1_images_per_head"] is None
    for li, row in enumerate(new["top1_images_per_head"]):  # heads in the race: the full sweep's numbers
        for h, m in enumerate(row):
            if m == 300:
                assert new["drop_points"][li][h] == full["drop_points"][li][h]


def test_advance_in_place_equals_a_copy_and_only_in_place_overwrites():
    from vitpos.experiments.common import Start, advance

    s = _deep(("own", "rope-axial"))
    x = images_for(s, n=11)
    start = Start(1, s.run_blocks(s.embed_tokens(x), 0, 1), torch.zeros(11, dtype=torch.long))
    before = start.tokens.clone()
    copy = advance(s, start, 3, batch_size=4)
    assert torch.equal(start.tokens, before)  # not in place: the input stream is untouched
    assert torch.equal(copy.tokens, s.run_blocks(before, 1, 3)) and copy.layer == 3
    moved = advance(s, start, 3, batch_size=4, in_place=True)
    assert moved.tokens.data_ptr() == start.tokens.data_ptr()  # no second copy of the stream
    assert torch.equal(moved.tokens, copy.tokens)
