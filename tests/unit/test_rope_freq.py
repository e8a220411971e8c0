"""rope_freq: channel frequencies on the typed axis map, band-limited axis removal and the experiment."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import images_for, tiny_own, tiny_surface, tiny_timm
from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.errors import VitposError
from vitpos.experiments.rope_freq import (
    RopeFreqExperiment,
    Spec,
    band_names,
    parse_windows,
    run_rope_freq,
)
from vitpos.hooks import capture, remove_rope, stack
from vitpos.models.surface import AXES, FreqBand
from vitpos.rope import fold_frequency

FAMILIES = [pytest.param(("own", "rope-axial"), id="own-rope-axial"),
            pytest.param(("own", "rope-mixed"), id="own-rope-mixed"),
            pytest.param(("timm", "rope_axial"), id="timm-rope_axial"),
            pytest.param(("timm", "rope_mixed"), id="timm-rope_mixed"),
            pytest.param(("timm", "rope_ape"), id="timm-rope_ape"),
            pytest.param(("timm", "eva02"), id="timm-eva02"),
            pytest.param(("timm", "dinov3"), id="timm-dinov3")]


def _expected_freqs(s, axis: str, layer: int, head: int) -> tuple[list[int], torch.Tensor]:
    """The rotary pairs of `axis` and their frequencies, from timm's own module settings (not the tensor)."""
    rope = s.model.rope
    if hasattr(rope, "freqs"):  # mixed: learned (2 = [x, y], depth, heads, d/2); 'xy' puts the column in x
        x_is_row = rope.grid_indexing == "ij"
        f = rope.freqs.detach()[0 if (axis == "row") == x_is_row else 1, layer, head]
        return list(range(f.numel())), fold_frequency(f)
    nb = s.head_dim // 4
    # pairs are coordinate-major (pair p: coordinate p // nb, band p % nb); coordinate 0 of timm's
    # grid is the row under 'ij' and the column under 'xy'
    coord = 0 if (axis == "row") == (rope.grid_indexing == "ij") else 1
    size = s.grid[0] if axis == "row" else s.grid[1]
    if hasattr(rope, "periods"):  # DINOv3: centred coordinates in [-1, 1], step 2 / size per patch
        step = 2 * math.pi / rope.periods.double() * (2 / size)
    else:  # index grid, EVA's rescale to the reference shape
        ref = rope.ref_feat_shape
        step = rope.bands.double() * (1.0 if ref is None else ref[0 if axis == "row" else 1] / size)
    return [coord * nb + k for k in range(nb)], fold_frequency(step)


@pytest.mark.parametrize("which", FAMILIES)
def test_channel_frequencies_are_timms_bands_at_this_grid(which):
    s = tiny_surface(which)
    amap = s.rope_axis_map()
    for axis in AXES:
        for layer, head in ((0, 0), (s.depth - 1, s.num_heads - 1)):
            pairs, f = amap.axis_pairs(axis, layer, head)
            want_pairs, want = _expected_freqs(s, axis, layer, head)
            assert pairs == want_pairs
            # mixed: the learned freqs themselves; axial: read off the float32 tensor
            torch.testing.assert_close(f, want, rtol=0, atol=1e-12 if amap.kind == "mixed" else 1e-5)
            assert bool((f >= 0).all()) and bool((f <= math.pi).all())


@pytest.mark.parametrize("which", FAMILIES)
@pytest.mark.parametrize("count", [2, 3, 4])
def test_bands_partition_an_axis_by_frequency(which, count):
    s = tiny_surface(which)
    amap = s.rope_axis_map()
    for axis in AXES:
        for layer, head in ((0, 0), (s.depth - 1, s.num_heads - 1)):
            pairs, f = amap.axis_pairs(axis, layer, head)
            freq = dict(zip(pairs, f.tolist(), strict=True))
            bands = [amap.band_pairs(axis, layer, head, FreqBand(i, count)) for i in range(count)]
            assert sorted(p for b in bands for p in b) == sorted(pairs)  # disjoint and complete
            assert max(len(b) for b in bands) - min(len(b) for b in bands) <= 1 and min(len(b) for b in bands) >= 1
            for lo, hi in zip(bands, bands[1:], strict=False):
                assert max(freq[p] for p in lo) <= min(freq[p] for p in hi)
            chans = amap.band_channels(axis, layer, head, FreqBand(count - 1, count))
            assert len(chans) == 2 * len(bands[-1])  # both members of every pair


def _rope_seen(s, layer: int, x: torch.Tensor, *contexts) -> torch.Tensor:
    """The rotary tensor block `layer`'s attention receives, as (h, N, 2d)."""
    seen = {}
    h = s.attention(layer).register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("rope", kw.get("rope")), with_kwargs=True)
    try:
        with stack(*contexts):
            s(x)
    finally:
        h.remove()
    r = seen["rope"]
    return (r if r.ndim == 3 else r.unsqueeze(0)).expand(s.num_heads, *r.shape[-2:])


@pytest.mark.parametrize("which", FAMILIES)
@pytest.mark.parametrize("count", [2, 3])
def test_removing_every_band_of_an_axis_is_removing_the_axis(which, count):
    s = tiny_surface(which)
    x = images_for(s, 3)
    for axis in AXES:
        whole = remove_rope(s, {axis: None}, layers=[0])
        with whole:
            want = s(x)
        bands = [remove_rope(s, {axis: None}, layers=[0], band=FreqBand(i, count)) for i in range(count)]
        with stack(*bands):
            got = s(x)
        assert torch.equal(got, want), axis
        assert torch.equal(_rope_seen(s, 0, x, *[remove_rope(s, {axis: None}, layers=[0], band=FreqBand(i, count))
                                                 for i in range(count)]),
                           _rope_seen(s, 0, x, remove_rope(s, {axis: None}, layers=[0])))
        # and fewer bands than all is not the whole axis
        with stack(*[remove_rope(s, {axis: None}, layers=[0], band=FreqBand(i, count)) for i in range(count - 1)]):
            assert not torch.equal(s(x), want)


@pytest.mark.parametrize("which", FAMILIES)
def test_a_band_removal_leaves_the_other_channels_exactly_untouched(which):
    s = tiny_surface(which)
    amap = s.rope_axis_map()
    x = images_for(s, 3)
    d, npt = s.head_dim, s.num_prefix_tokens
    clean = _rope_seen(s, 0, x)
    with capture(s, ["blocks.0.q_rot", "blocks.0.k_rot"]) as c0:
        s(x)
    for axis in AXES:
        for index in (0, 2):
            band = FreqBand(index, 3)
            ctx = remove_rope(s, {axis: None}, layers=[0], band=band)
            got = _rope_seen(s, 0, x, remove_rope(s, {axis: None}, layers=[0], band=band))
            whole = _rope_seen(s, 0, x, remove_rope(s, {axis: None}, layers=[0]))
            with ctx, capture(s, ["blocks.0.q_rot", "blocks.0.k_rot"]) as c1:
                s(x)
            for head in range(s.num_heads):
                chans = amap.band_channels(axis, 0, head, band)
                inside = torch.tensor(chans + [d + j for j in chans])
                outside = torch.tensor([j for j in range(2 * d) if j not in set(inside.tolist())])
                assert torch.equal(got[head][:, outside], clean[head][:, outside])
                assert torch.equal(got[head][:, inside], whole[head][:, inside])  # the axis' own removal there
                assert not torch.equal(got[head][:, inside], clean[head][:, inside])
                if amap.kind == "axial":  # identity rotation: sin 0, cos 1
                    assert bool((got[head][:, chans] == 0).all()) and bool((got[head][:, [d + j for j in chans]] == 1)
                                                                          .all())
                keep = torch.tensor([j for j in range(d) if j not in set(chans)])
                for site in ("blocks.0.q_rot", "blocks.0.k_rot"):
                    a, b = c1[site][:, head, npt:], c0[site][:, head, npt:]
                    assert torch.equal(a[..., keep], b[..., keep]), (axis, index, head, site)
                    assert not torch.equal(a[..., chans], b[..., chans])
                    assert torch.equal(c1[site][:, head, :npt], c0[site][:, head, :npt])  # prefix never rotated


def test_band_removal_refusals():
    s = tiny_own("rope-axial")
    amap = s.rope_axis_map()
    with pytest.raises(VitposError, match="0 <= index < count"):
        FreqBand(3, 3)
    with pytest.raises(VitposError, match="at most 4 bands"):
        amap.band_pairs("row", 0, 0, FreqBand(0, 5))
    with pytest.raises(VitposError, match="unknown axis"):
        amap.axis_pairs("depth", 0, 0)  # type: ignore[arg-type]
    with pytest.raises(VitposError, match="outside"):
        amap.axis_pairs("row", s.depth, 0)


# --- the experiment ----------------------------------------------------------------------------------

def _rope4(pe: str = "rope-mixed"):
    from conftest import TINY
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface

    torch.manual_seed(0)
    cfg = OwnViTConfig(pe=pe, **{**TINY, "depth": 4})
    return OwnSurface(build_own_vit(cfg).eval(), f"tiny:{pe}4", cfg)


def _toy(n: int, seed: int = 0, size: int = 16) -> TensorImageDataset:
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(size, size),
                       in_chans=3)
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    return TensorImageDataset(images, torch.randint(0, 4, (n,), generator=g), info, "test")


def _leaves(doc, path: str = ""):
    if isinstance(doc, dict):
        return [x for k, v in doc.items() for x in _leaves(v, f"{path}/{k}")]
    if isinstance(doc, list):
        return [x for i, v in enumerate(doc) for x in _leaves(v, f"{path}[{i}]")]
    return [(path, doc)]


def _assert_same(old: dict, new: dict) -> None:
    want, got = _leaves(old), _leaves(new)
    assert [p for p, _ in want] == [p for p, _ in got]
    diffs = [(p, a, b) for (p, a), (_, b) in zip(want, got, strict=True)
             if not (a == b or isinstance(a, float) and isinstance(b, float) and abs(a - b) <= 1e-5)]
    assert not diffs, diffs[:10]


def test_the_conditions_are_what_they_claim():
    s, data = _rope4(), _toy(60)
    windows = [(0, 2), (2, 4), (0, 4)]
    doc = run_rope_freq(s, data, n_images=60, bands=3, windows=windows).to_json()
    assert doc["layers"] == [1, 3] and doc["windows"] == [[0, 2], [2, 4], [0, 4]] and doc["rope_kind"] == "mixed"
    names = ["baseline"] + [f"no_{a}_{b}_L{w0}-{w1 - 1}" for a in AXES for b in ("low", "mid", "high", "all")
                            for w0, w1 in windows]
    assert list(doc["conditions"]) == names
    x = torch.cat([b for b, _ in data.batches(60)])
    y = data.labels
    conds = doc["conditions"]
    base = conds["baseline"]
    clean = s(x)
    for name, c in conds.items():
        if name == "baseline":
            continue
        axis, band, win = c["axis"], c["band"], c["window"]
        index = None if band == "all" else band_names(3).index(band)
        manual = remove_rope(s, {axis: None}, layers=range(*win), band=None if index is None else FreqBand(index, 3))
        with manual:
            logits = s(x)
        with Spec(axis, index, tuple(win), 3).context(s)():
            assert torch.equal(s(x), logits), name
        assert not torch.equal(logits, clean), name  # every condition does act on the model
        top1 = float((logits.argmax(-1) == y).float().mean())
        assert c["top1"] == pytest.approx(top1)
        assert c["top1_drop_points"] == pytest.approx(100 * (base["top1"] - top1))
        lo, hi = c["top1_drop_ci95"]
        assert lo <= c["top1_drop_points"] + 1e-6 and c["top1_drop_points"] <= hi + 1e-6
        assert c["axis_drop_points"] == pytest.approx([100 * (b - v) for b, v in zip(base[f"{axis}_acc"],
                                                                                     c[f"{axis}_acc"], strict=True)])
        for (lo, hi), v in zip(c["axis_drop_ci95"], c["axis_drop_points"], strict=True):
            assert lo <= v + 1e-6 and v <= hi + 1e-6
        whole = conds[f"no_{axis}_all_L{win[0]}-{win[1] - 1}"]
        for i, share in enumerate(c["share"]):
            ref = whole["axis_drop_points"][i]
            assert share == (None if ref < 100 * doc["min_gap"] else pytest.approx(c["axis_drop_points"][i] / ref))
        # before its window a condition is the clean model: its probes at earlier layers are the clean ones
        for i, layer in enumerate(doc["layers"]):
            if layer < win[0]:
                assert c["row_acc"][i] == base["row_acc"][i] and c["col_acc"][i] == base["col_acc"][i]
    for sp in doc["splits"]:
        a, (w0, w1) = sp["axis"], sp["window"]
        hi_c, lo_c = conds[f"no_{a}_high_L{w0}-{w1 - 1}"], conds[f"no_{a}_low_L{w0}-{w1 - 1}"]
        assert sp["layer"] == 3
        want = 100 * (lo_c[f"{a}_acc"][-1] - hi_c[f"{a}_acc"][-1])
        assert sp["high_minus_low_axis_drop_points"] == pytest.approx(want)
        assert sp["high_minus_low_top1_drop_points"] == pytest.approx(100 * (lo_c["top1"] - hi_c["top1"]))
        ci = sp["high_minus_low_axis_drop_ci95"]
        assert sp["position_in"] == ("high" if ci[0] > 0 else "low" if ci[1] < 0 else "unresolved")
    info = doc["band_info"]["row"]
    assert [b["name"] for b in info] == ["low", "mid", "high", "all"] and info[-1]["pairs"] == s.head_dim // 2
    assert info[0]["freq_min"] == info[-1]["freq_min"] and info[2]["freq_max"] == info[-1]["freq_max"]


@pytest.mark.parametrize("windows, layers", [(None, None), ([(0, 1), (0, 3), (0, 4), (2, 4), (2, 3)], None),
                                             ([(1, 4), (3, 4)], [0, 2, 3])])
def test_shared_prefix_gives_the_same_numbers(windows, layers):
    s, data = _rope4("rope-axial"), _toy(48)
    old = run_rope_freq(s, data, n_images=48, bands=2, windows=windows, layers=layers, shared_prefix=False).to_json()
    new = run_rope_freq(s, data, n_images=48, bands=2, windows=windows, layers=layers).to_json()
    _assert_same(old, new)


@pytest.mark.parametrize("key", ["rope_axial", "rope_mixed", "eva02", "dinov3"])
def test_runs_on_timm_rope_families(key):
    """naver rope ViTs (axial, mixed), EVA-02 and DINOv3: the conditions run, and the shared-prefix
    path gives the per-condition path's numbers."""
    s = tiny_timm(key)
    data = _toy(32, size=s.input_size[1])
    new = run_rope_freq(s, data, n_images=32, bands=2).to_json()
    old = run_rope_freq(s, data, n_images=32, bands=2, shared_prefix=False).to_json()
    _assert_same(old, new)
    assert len(new["conditions"]) == 1 + 2 * 3 * 3 and new["rope_kind"] == s.rope_axis_map().kind
    assert all(len(v) == 3 for v in new["band_info"].values())


def test_refusals_and_applicability():
    exp = RopeFreqExperiment()
    assert "rotary" in (exp.applies_to(tiny_own("ape")) or "")
    s = tiny_own("rope-axial")
    assert exp.applies_to(s) is None
    with pytest.raises(VitposError, match="no rotary embedding"):
        run_rope_freq(tiny_own("ape"), _toy(8), n_images=8)
    with pytest.raises(VitposError, match="--bands 5: use 2..4"):
        run_rope_freq(s, _toy(8), n_images=8, bands=5)
    with pytest.raises(VitposError, match="--windows 1:1"):
        run_rope_freq(s, _toy(8), n_images=8, windows=[(1, 1)])
    with pytest.raises(VitposError, match="--windows 0:3"):
        run_rope_freq(s, _toy(8), n_images=8, windows=[(0, 3)])
    with pytest.raises(VitposError, match="--layers 2"):
        run_rope_freq(s, _toy(8), n_images=8, layers=[2])
    assert parse_windows("0:1, 1:2") == [(0, 1), (1, 2)] and parse_windows(None) is None
    for bad in ("0-1", "a:b", "0:1:2"):
        with pytest.raises(VitposError, match="START:STOP"):
            parse_windows(bad)
    for bad, why in (("", "is empty"), ("0:1,", "empty item"), ("0:1, 0:1", "names 0:1 twice")):
        with pytest.raises(VitposError, match=why):
            parse_windows(bad)
    with pytest.raises(VitposError, match="--layers 1 is given twice"):
        run_rope_freq(s, _toy(8), n_images=8, layers=[1, 1])


def test_document_figure_and_report_section(tmp_path):
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES

    s = tiny_own("rope-mixed")
    result = run_rope_freq(s, _toy(40), n_images=40, bands=2, out=tmp_path)
    assert (tmp_path / "rope_freq.json").exists()
    assert (tmp_path / "rope_freq.png").read_bytes().startswith(b"\x89PNG")
    assert RopeFreqExperiment().load(result.to_json()) == result
    html = BY_NAME["rope_freq"].section(result, CLAIM_RULES)
    assert "no_row_high_L0-1" in html and "position carried by" in html and "frequency range" in html
