"""Model surface, hook engine and RoPE edits: equivalences and invariants that must hold exactly."""

from __future__ import annotations

import pytest
import torch

from conftest import TIMM_TINY, images_for, permute_patches, tiny_own, tiny_timm
from vitpos.errors import VitposError
from vitpos.hooks import capture, edit, remove_rope, zero_ablate
from vitpos.models.surface import Site

ALL_SURFACES = [("own", pe) for pe in ("ape", "ape-sincos", "rope-axial", "rope-mixed", "rope-ape", "none")] + [
    ("timm", k) for k in TIMM_TINY
]


def make(kind: str, key: str):
    return tiny_own(key) if kind == "own" else tiny_timm(key)


EDITABLE = ["embed", "resid_pre", "resid_post", "attn_out", "mlp_out", "q", "k", "z"]


@pytest.mark.parametrize("kind,key", ALL_SURFACES)
def test_identity_edit_and_capture_are_bit_identical(kind, key):
    s = make(kind, key)
    x = images_for(s)
    plain = s(x)
    with edit(s, {name: (lambda t: t) for name in EDITABLE}):
        edited = s(x)
    assert torch.equal(plain, edited)
    sites = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "q", "k", "q_rot", "k_rot", "embed"]
    with capture(s, sites) as c:
        captured = s(x)
    assert torch.equal(plain, captured)
    T = s.num_prefix_tokens + s.num_patches
    assert c["blocks.1.resid_post"].shape == (3, T, s.width)
    assert c["blocks.0.q"].shape == (3, s.num_heads, T, s.head_dim)
    # residual bookkeeping: resid_post = resid_mid + (scaled) mlp_out, exactly what the block adds
    assert (torch.allclose(c["blocks.0.resid_pre"][:, :], c["embed"], atol=1e-6)
            or s.model.norm_pre.__class__.__name__ != "Identity")
    if not s.has_rope:
        assert torch.equal(c["blocks.0.q_rot"], c["blocks.0.q"])


@pytest.mark.parametrize("kind,key", [("own", "rope-axial"), ("timm", "vit"), ("timm", "dinov3")])
def test_attention_pattern_capture(kind, key):
    s = make(kind, key)
    x = images_for(s)
    plain = s(x)
    with capture(s, ["attn_pattern"]) as c:
        out = s(x)
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)  # unfused path: same math, other kernel
    pat = c["blocks.0.attn_pattern"]
    T = s.num_prefix_tokens + s.num_patches
    assert pat.shape == (3, s.num_heads, T, T)
    torch.testing.assert_close(pat.sum(-1), torch.ones(3, s.num_heads, T))
    assert all(getattr(s.attention(i), "fused_attn", True) in (True, False) for i in range(s.depth))


def test_hooks_are_removed_after_an_exception():
    s = tiny_own("rope-axial")
    x = images_for(s)
    plain = s(x)
    fused_before = [s.attention(i).fused_attn for i in range(s.depth)]
    with pytest.raises(RuntimeError, match="boom"):
        with edit(s, {"resid_post": zero_ablate()}), remove_rope(s, {"row": None}), capture(s, ["attn_pattern"]):
            s(x)
            raise RuntimeError("boom")
    assert torch.equal(s(x), plain)
    assert [s.attention(i).fused_attn for i in range(s.depth)] == fused_before
    for mod in s.model.modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks


def test_edit_changes_output_and_capture_only_sites_refuse_edits():
    s = tiny_own("ape")
    x = images_for(s)
    with edit(s, {"blocks.1.mlp_out": zero_ablate()}):
        ablated = s(x)
    assert not torch.allclose(ablated, s(x))
    with pytest.raises(VitposError, match="captured but not edited"):
        with edit(s, {"blocks.0.resid_mid": lambda t: t}):
            pass
    with pytest.raises(VitposError, match="unknown hook site"):
        Site.parse("blocks.0.nope")
    with pytest.raises(VitposError, match="layers 0..1"):
        Site.parse("blocks.9.q", depth=2)


@pytest.mark.parametrize("kind,key",
                         [("own", "rope-axial"), ("own", "rope-mixed"), ("timm", "dinov3"), ("timm", "eva02")])
def test_rope_logits_depend_only_on_patch_offset(kind, key):
    s = make(kind, key)
    H, W = s.grid
    rope = s.model.rope
    base = rope.get_embed() if getattr(rope, "feat_shape", None) else rope.get_embed(shape=list(s.grid))
    rope = base[0] if base.ndim == 4 else base  # mixed: (depth, h, N, 2d) -> layer 0
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, s.num_heads, 1, s.head_dim, generator=g).expand(1, s.num_heads, s.num_patches, s.head_dim)
    k = torch.randn(1, s.num_heads, 1, s.head_dim, generator=g).expand(1, s.num_heads, s.num_patches, s.head_dim)
    pad = torch.zeros(1, s.num_heads, s.num_prefix_tokens, s.head_dim)
    qr = s.apply_rope(torch.cat([pad, q], 2), rope)[:, :, s.num_prefix_tokens:]
    kr = s.apply_rope(torch.cat([pad, k], 2), rope)[:, :, s.num_prefix_tokens:]
    logits = (qr @ kr.transpose(-1, -2))[0]  # (h, N, N), same content everywhere: only position differs

    def n(r, c):
        return r * W + c

    for (r1, c1, r2, c2, dr, dc) in [(0, 0, 1, 2, 1, 1), (1, 0, 2, 1, 1, 1), (0, 1, 2, 0, 1, 2)]:
        a = logits[:, n(r1, c1), n(r2, c2)]
        b = logits[:, n(r1 + dr, c1 + dc), n(r2 + dr, c2 + dc)]
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # and it does depend on the offset itself
    assert not torch.allclose(logits[:, n(0, 0), n(0, 1)], logits[:, n(0, 0), n(1, 0)], atol=1e-4)


@pytest.mark.parametrize("kind,key", [("own", "none"), ("own", "rope-axial"), ("own", "rope-mixed"),
                                      ("timm", "rope_axial"), ("timm", "dinov3")])
def test_no_position_means_patch_permutation_equivariance(kind, key):
    s = make(kind, key)
    x = images_for(s, n=2)
    perm = torch.randperm(s.num_patches, generator=torch.Generator().manual_seed(3))
    ctx = remove_rope(s, {"row": None, "col": None}) if s.has_rope else edit(s, {})
    sites = ["blocks.1.resid_post"]
    npt = s.num_prefix_tokens
    with ctx, capture(s, sites) as c:
        out = s(x)
        out_p = s(permute_patches(x, perm, s.grid))
    acts = c["blocks.1.resid_post"]
    a, b = acts[:2], acts[2:]
    torch.testing.assert_close(b[:, npt:], a[:, npt:][:, perm], atol=1e-5, rtol=1e-5)  # patches move with the input
    torch.testing.assert_close(b[:, :npt], a[:, :npt], atol=1e-5, rtol=1e-5)  # CLS/registers do not change
    torch.testing.assert_close(out_p, out, atol=1e-5, rtol=1e-5)
    if s.has_rope:  # sanity: with rotations on, the same permutation does change the CLS state
        with capture(s, sites) as c_on:
            s(x)
            s(permute_patches(x, perm, s.grid))
        on = c_on["blocks.1.resid_post"]
        err_off = (b[:, npt:] - a[:, npt:][:, perm]).abs().max()
        err_on = (on[2:, npt:] - on[:2, npt:][:, perm]).abs().max()
        assert err_on > 100 * err_off + 1e-6


@pytest.mark.parametrize("kind,key", [("own", "rope-axial"), ("timm", "rope_axial"), ("timm", "dinov3")])
def test_removing_row_keeps_equivariance_within_columns(kind, key):
    s = make(kind, key)
    H, W = s.grid
    x = images_for(s, n=2)
    g = torch.Generator().manual_seed(5)
    perm = torch.arange(H * W).reshape(H, W)
    for c in range(W):  # shuffle rows independently inside each column: every patch keeps its column
        perm[:, c] = perm[torch.randperm(H, generator=g), c]
    perm = perm.flatten()
    npt = s.num_prefix_tokens
    with remove_rope(s, {"row": None}), capture(s, ["blocks.1.resid_post"]) as c_:
        s(x)
        s(permute_patches(x, perm, s.grid))
    acts = c_["blocks.1.resid_post"]
    torch.testing.assert_close(acts[2:, npt:], acts[:2, npt:][:, perm], atol=1e-5, rtol=1e-5)
    # a permutation that moves patches across columns breaks it (column rotations are still on)
    cross = torch.randperm(H * W, generator=g)
    with remove_rope(s, {"row": None}), capture(s, ["blocks.1.resid_post"]) as c2:
        s(x)
        s(permute_patches(x, cross, s.grid))
    acts2 = c2["blocks.1.resid_post"]
    err_within = (acts[2:, npt:] - acts[:2, npt:][:, perm]).abs().max()
    err_cross = (acts2[2:, npt:] - acts2[:2, npt:][:, cross]).abs().max()
    assert err_cross > 100 * err_within + 1e-6


def test_axis_maps_match_timm_layouts():
    # naver 'xy': first half of channels turn with the column; EVA-02 'ij': first half row;
    # DINOv3 (rotate_half): row = [0, d/4) u [d/2, 3d/4)
    d = 16
    axial = tiny_timm("rope_axial").rope_axis_map()
    assert axial.channels("col") == list(range(d // 2)) and axial.channels("row") == list(range(d // 2, d))
    eva = tiny_timm("eva02").rope_axis_map()
    assert eva.channels("row") == list(range(d // 2)) and eva.channels("col") == list(range(d // 2, d))
    dino = tiny_timm("dinov3").rope_axis_map()
    assert dino.channels("row") == list(range(d // 4)) + list(range(d // 2, 3 * d // 4))
    own = tiny_own("rope-axial").rope_axis_map()
    assert own.channels("col") == list(range(d // 2))
    mixed = tiny_own("rope-mixed").rope_axis_map()
    assert mixed.kind == "mixed" and mixed.freqs.shape == (2, 2, 2, d // 2)


@pytest.mark.parametrize("key", ["rope-mixed", "rope-axial"])
def test_rope_embed_without_removal_is_timms_tensor(key):
    s = tiny_own(key)
    emb = s.model.rope.get_embed()
    for layer in range(s.depth):
        base = emb[layer] if emb.ndim == 4 else emb
        torch.testing.assert_close(s.rope_embed(layer, base, {}), base.expand(s.num_heads, *base.shape[-2:]),
                                   atol=0, rtol=0)
        # removing the row for one head touches only that head
        out = s.rope_embed(layer, base, {"row": [1]})
        torch.testing.assert_close(out[0], base.expand(s.num_heads, *base.shape[-2:])[0], atol=0, rtol=0)
        assert not torch.equal(out[1], base.expand(s.num_heads, *base.shape[-2:])[1])


def test_mixed_removal_equals_recomputing_without_the_axis():
    s = tiny_own("rope-mixed")
    H, W = s.grid
    base = s.model.rope.get_embed()[0]
    no_row = s.rope_embed(0, base, {"row": None})
    # with the row removed, every row of the grid shares the row-0 rotation (row coordinate 0)
    e = no_row.reshape(s.num_heads, H, W, -1)
    torch.testing.assert_close(e, e[:, :1].expand_as(e), atol=1e-6, rtol=0)
    torch.testing.assert_close(e[:, 0], base.reshape(s.num_heads, H, W, -1)[:, 0], atol=1e-6, rtol=0)


def test_rope_edit_refused_without_rope():
    with pytest.raises(VitposError, match="no rotary embedding"):
        with remove_rope(tiny_own("ape"), {"row": None}):
            pass


@pytest.mark.slow
def test_timm_loading_paths(tmp_path, monkeypatch):
    from conftest import TIMM_TINY
    from vitpos.io import write_safetensors
    from vitpos.models import load_model

    spec = TIMM_TINY["rope_mixed"]
    a = load_model(spec)
    ck = tmp_path / "w.safetensors"
    write_safetensors(ck, a.model.state_dict())
    torch.manual_seed(123)  # a different random init, then the checkpoint must win
    b = load_model(spec, checkpoint=ck)
    x = images_for(a)
    assert torch.equal(a(x), b(x))
    with pytest.raises(VitposError, match="never unpickles"):
        load_model(spec, checkpoint=tmp_path / "w.pth")
    with pytest.raises(VitposError, match="timm has no model"):
        load_model("timm:not_a_model")
    with pytest.raises(VitposError, match="not a timm VisionTransformer or Eva"):
        load_model("timm:resnet18?num_classes=4")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on an offline machine: the hub cannot be reached
    with pytest.raises(VitposError, match="--checkpoint"):
        load_model("timm:vit_tiny_patch16_224", pretrained=True)


@pytest.mark.parametrize("kind,key", [("own", "rope-axial"), ("timm", next(iter(TIMM_TINY)))])
def test_z_is_what_the_output_projection_reads(kind, key):
    """blocks.L.z holds every head's output: attn_out is affine in it (zero, intact and doubled z
    lie on one line), and editing one head's slice changes attn_out while a no-op edit does not."""
    s = make(kind, key)
    x = images_for(s)
    outs = []
    for scale in (0.0, 1.0, 2.0):
        with edit(s, {Site(0, "z"): lambda t, scale=scale: t * scale}), capture(s, [Site(0, "attn_out")]) as c:
            s(x)
        outs.append(c["blocks.0.attn_out"])
    torch.testing.assert_close(outs[2] - outs[1], outs[1] - outs[0], atol=1e-5, rtol=1e-4)
    with capture(s, [Site(0, "z")]) as c:
        s(x)
    z = c["blocks.0.z"]
    assert z.shape[:3] == (x.shape[0], s.num_heads, s.num_prefix_tokens + s.num_patches)

    def zero_head0(t):
        t = t.clone()
        t[:, 0] = 0
        return t
    with edit(s, {Site(0, "z"): zero_head0}), capture(s, [Site(0, "attn_out")]) as c:
        s(x)
    assert not torch.allclose(c["blocks.0.attn_out"], outs[1])


@pytest.mark.parametrize("kind,key", [("own", "rope-axial"), ("own", "ape"), ("timm", next(iter(TIMM_TINY)))])
def test_head_projections_split_attn_out_into_heads(kind, key):
    """Each head's share z_h @ P[h], summed over heads, plus the projection's bias is attn_out."""
    s = make(kind, key)
    x = images_for(s)
    with capture(s, [Site(1, "z"), Site(1, "attn_out")]) as c:
        s(x)
    P = s.head_projections(1)
    assert P.shape == (s.num_heads, s.width // s.num_heads, s.width)
    shares = torch.einsum("bhtd,hdD->bhtD", c["blocks.1.z"], P)
    bias = s.attention(1).get_submodule("proj").bias
    torch.testing.assert_close(shares.sum(1) + bias, c["blocks.1.attn_out"], atol=1e-5, rtol=1e-4)


def test_rope_heads_restore_stats_are_the_captured_means_and_probe_readouts():
    """The running means rope_heads mean-ablates with equal the mean of the captured z over
    images and patch tokens, from the input or from a restore stream, and observing is a no-op;
    each head's direct effect equals the probe's own logits of the head's share of attn_out (minus
    the logits of zero), as the true coordinate's logit minus the mean logit."""
    from types import SimpleNamespace

    from vitpos.analysis.kept import Keep
    from vitpos.analysis.linear_probe import LinearProbe
    from vitpos.analysis.probes import position_labels
    from vitpos.data.base import DatasetInfo, TensorImageDataset
    from vitpos.experiments.common import capture_condition, condition_context
    from vitpos.experiments.rope_heads_rebuild import _restore_stats

    s = tiny_own("rope-axial")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 16, 16), generator=g, dtype=torch.uint8)
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3)
    data = TensorImageDataset(images, torch.zeros(5, dtype=torch.long), info, "test")
    x = next(iter(data.batches(5)))[0]
    H, W = s.grid
    probe = LinearProbe(H)
    probe._set(torch.randn(s.width, H, generator=g), torch.randn(H, generator=g), torch.randn(s.width, generator=g),
               torch.rand(s.width, generator=g) + 0.5)
    probes = {1: SimpleNamespace(row_probe=probe)}

    npt = s.num_prefix_tokens
    ctx = condition_context(s, ("row",), 1)
    with ctx(), capture(s, [Site(1, "z")]) as c:
        plain = s(x)
    z = c["blocks.1.z"][:, :, npt:]
    want = z.double().mean((0, 2)).float()
    shares = torch.einsum("bhnd,hdD->bhnD", z, s.head_projections(1))
    logits = probe.logits(shares) - probe.logits(torch.zeros(s.width))
    true = logits.gather(-1, position_labels(s.grid, "row").view(1, 1, -1, 1).expand(*logits.shape[:3], 1))[..., 0]
    want_direct = (true - logits.mean(-1)).mean(-1)  # (images, heads)
    stats = _restore_stats(s, data, ctx, None, [1], probes, ("row",))
    torch.testing.assert_close(stats.z_means[1], want)
    torch.testing.assert_close(stats.direct[:, 0].float(), want_direct, atol=1e-4, rtol=1e-4)
    *_, start = capture_condition(s, data, ctx, {Site(1, "resid_post"): Keep.whole(range(1))}, keep_pre=1)
    from_stream = _restore_stats(s, data, ctx, start, [1], probes, ("row",))
    torch.testing.assert_close(from_stream.z_means[1], want)
    torch.testing.assert_close(from_stream.direct, stats.direct)
    with ctx():
        assert torch.equal(s(x), plain)
