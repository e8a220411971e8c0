"""Causal experiments on tiny models: the properties the study's measurements rest on."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_own
from vitpos.data.base import DatasetInfo, TensorImageDataset
from vitpos.errors import VitposError
from vitpos.experiments.ape_permute import run_ape_permute
from vitpos.experiments.ape_permute_variants import permute_features, random_perms
from vitpos.experiments.rope_axis import condition_context, probe_condition, run_rope_axis
from vitpos.sae import SAE, SAEConfig

INFO = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3)


def toy_images(n: int, seed: int = 0, content: float = 0.03) -> TensorImageDataset:
    """Near-constant images: one shared pattern per patch plus a little noise, so any position
    information in the activations comes from the positional encoding, not from content."""
    g = torch.Generator().manual_seed(seed)
    patch = torch.rand(3, 4, 4, generator=g)
    base = patch.repeat(1, 4, 4)
    x = (base + content * torch.rand(n, 3, 16, 16, generator=g)).clamp(0, 1)
    return TensorImageDataset((x * 255).to(torch.uint8), torch.randint(0, 4, (n,), generator=g), INFO, "test")


def planted_rope_model():
    """A planted toy RoPE model: sharp q/k, a strong attention output and a large CLS token, so
    attention (to the unrotated CLS and to neighbours) makes each patch's state a clear function
    of its position; content is near-constant, so all of that position comes from the rotations."""
    s = tiny_own("rope-axial", seed=0)
    with torch.no_grad():
        s.model.cls_token.mul_(30)
        for b in s.model.blocks:
            b.attn.qkv.weight[: 2 * s.width] *= 8
            b.attn.proj.weight.mul_(50)
    return s


@pytest.fixture(scope="module")
def rope_model():
    return planted_rope_model()


def test_both_axes_removed_leaves_no_position(rope_model):
    ds = toy_images(160)
    res = probe_condition(rope_model, ds, condition_context(rope_model, ("row", "col")), seed=0)["doc"]
    chance = 1 / 4
    for a in ("row_acc", "col_acc"):
        assert max(res[a]) <= chance + 0.08, (a, res[a])  # equivariant model: nothing positional survives


def test_no_row_removes_row_but_keeps_columns(rope_model):
    ds = toy_images(160)
    base = probe_condition(rope_model, ds, None, seed=0)
    no_row = probe_condition(rope_model, ds, condition_context(rope_model, ("row",)), base["probes"], seed=0)["doc"]
    b = base["doc"]
    assert min(b["row_acc"]) > 0.6 and min(b["col_acc"]) > 0.6  # RoPE alone makes position decodable here
    assert max(no_row["row_acc"]) <= 0.25 + 0.08
    assert min(c - 0.15 for c in b["col_acc"]) <= min(no_row["col_acc"])
    assert no_row["row_acc_orig_probe"][0] < b["row_acc"][0]


@pytest.mark.slow
def test_rope_axis_document_and_restore(rope_model, tmp_path):
    doc = run_rope_axis(rope_model, data=toy_images(120), n_images=120, restore_points=[1], out=tmp_path).to_json()
    assert (tmp_path / "rope_axis.json").exists() and (tmp_path / "rope_axis.png").exists()
    assert set(doc["conditions"]) == {"baseline", "no_row", "no_col", "no_both", "restore_row_R1", "restore_col_R1"}
    for c in doc["conditions"].values():
        assert len(c["row_acc"]) == rope_model.depth and 0 <= c["top1"] <= 1
    # restored from layer 1 on: layer 0 is exactly the no_row state, so its recovery is undefined (null)
    assert doc["conditions"]["restore_row_R1"]["row_acc"][0] == doc["conditions"]["no_row"]["row_acc"][0]
    assert doc["recovery"]["row"]["1"]["rec"][0] is None


def test_rope_tests_refuse_ape_models():
    with pytest.raises(VitposError, match="RoPE"):
        run_rope_axis(tiny_own("ape"), data=toy_images(8), n_images=8)


# --- APE permutation --------------------------------------------------------------------------

def _sae(d: int = 32) -> SAE:
    torch.manual_seed(0)
    return SAE(SAEConfig(d_in=d, expansion=4, k=8)).eval()


def test_identity_permutation_is_exact_and_edit_stays_in_feature_span():
    sae = _sae()
    x = torch.randn(3, 16, 32)
    z = sae.encode(x)
    ids = [0, 5, 9, 17]
    ident = torch.arange(16).expand(3, 16)
    assert torch.equal(permute_features(x, z, sae, ids, ident), x)
    perm = random_perms("all", 3, (4, 4), torch.Generator().manual_seed(0))
    delta = permute_features(x, z, sae, ids, perm) - x
    D = sae.W_dec[ids].T  # (d, |F|) decoder directions
    proj = D @ torch.linalg.lstsq(D, delta.reshape(-1, 32).T).solution
    torch.testing.assert_close(proj.T.reshape_as(delta), delta, atol=1e-5, rtol=1e-4)
    assert delta.abs().max() > 0


def test_row_and_col_permutations_keep_the_other_coordinate():
    g = torch.Generator().manual_seed(1)
    H, W = 3, 5
    n = torch.arange(H * W)
    for kind, keep in (("row", n % W), ("col", n // W)):
        p = random_perms(kind, 4, (H, W), g)
        moved = (p % W) if kind == "row" else (p // W)
        assert torch.equal(moved, keep.expand(4, -1))
        assert all(sorted(r.tolist()) == list(range(H * W)) for r in p)


@pytest.mark.slow
def test_ape_permute_identity_variant_gives_baseline_and_refuses_rope(tmp_path):
    s = tiny_own("ape")
    ds = toy_images(64)
    sae = _sae()
    doc = {"layer": 0, "site": "resid_post", "row_features": [1, 2], "col_features": [3]}
    res = run_ape_permute(s, sae, doc, data=ds, n_images=64, seeds=(0,)).to_json()
    assert res["baseline_top1"] == pytest.approx(res["baseline_top1"])
    for v in ("all", "row_only", "col_only", "mean_ablate", "pos_embed_shuffle"):
        assert 0 <= res[v]["top1"] <= 1
        assert res[v]["drop_points"] == pytest.approx(100 * (res["baseline_top1"] - res[v]["top1"]))
    with pytest.raises(VitposError, match="absolute position"):
        run_ape_permute(tiny_own("rope-axial"), sae, doc, data=ds, n_images=8)


@pytest.mark.slow
def test_experiments_run_on_timm_models():
    from conftest import tiny_timm

    ds = toy_images(48)
    vit = tiny_timm("deit3")  # timm VisionTransformer with APE
    sae = _sae(vit.width)
    doc = {"layer": 1, "site": "resid_post", "row_features": [0, 1], "col_features": [2], "mixed_features": [3]}
    res = run_ape_permute(vit, sae, doc, data=ds, n_images=48, seeds=(0,)).to_json()
    assert res["pos_embed_shuffle"]["top1"] <= 1 and res["all_positional"]["n_features"] == 4
    for key in ("rope_axial", "rope_mixed", "dinov3"):
        axis = run_rope_axis(tiny_timm(key), data=ds, n_images=48, restore_points=[1]).to_json()
        assert axis["conditions"]["no_both"]["row_acc"][-1] <= 0.25 + 0.15  # no APE: nothing positional survives
        assert axis["rope"]["kind"] == ("mixed" if key == "rope_mixed" else "axial")
