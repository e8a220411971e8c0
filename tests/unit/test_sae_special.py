"""Special tokens on purpose (vitpos.sae.special) and the SAE fidelity helpers of sae_run: planted
outliers are found, dropped from training batches and kept out of the splice; a batch without any
passes through as the same tensor (the shipped models train bit-identically); decoder matching
recovers a permuted copy and not an unrelated SAE."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_own, tiny_timm
from vitpos.experiments.sae_heldout import keep_outliers
from vitpos.experiments.sae_run import seed_stability
from vitpos.sae import SAE, SAEConfig
from vitpos.sae.special import OUTLIER_K, drop_outliers, layer_special, norm_threshold, prefix_names


def planted(n: int = 200, d: int = 8, n_out: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1) * (1 + 0.1 * torch.rand(n, 1, generator=g))
    idx = torch.randperm(n, generator=g)[:n_out]
    x[idx] *= 3 * OUTLIER_K  # far above k x the median norm
    return x, idx


def test_threshold_is_k_times_the_median():
    norms = torch.tensor([1.0, 2.0, 3.0, 100.0, 2.5])
    assert norm_threshold(norms) == OUTLIER_K * 2.5
    assert norm_threshold(norms, 3.0) == 7.5


def test_planted_outliers_are_dropped_and_counted():
    x, idx = planted()
    thr = norm_threshold(x.norm(dim=-1))
    counter = [0]
    (out,) = list(drop_outliers(iter([x]), thr, counter))
    assert counter[0] == len(idx) and out.shape[0] == x.shape[0] - len(idx)
    keep = torch.ones(x.shape[0], dtype=torch.bool)
    keep[idx] = False
    assert torch.equal(out, x[keep])


def test_a_batch_without_outliers_is_the_same_tensor():
    x, _ = planted(n_out=0)
    counter = [0]
    (out,) = list(drop_outliers(iter([x]), norm_threshold(x.norm(dim=-1)), counter))
    assert out is x and counter[0] == 0
    (out,) = list(drop_outliers(iter([x]), None, counter))  # --include-special
    assert out is x


def test_the_splice_keeps_outliers_and_only_them():
    x, idx = planted()
    recon = torch.zeros_like(x)
    got = keep_outliers(x, recon, norm_threshold(x.norm(dim=-1)))
    assert torch.equal(got[idx], x[idx])
    rest = torch.ones(x.shape[0], dtype=torch.bool)
    rest[idx] = False
    assert torch.equal(got[rest], recon[rest])
    clean, _ = planted(n_out=0)
    assert keep_outliers(clean, recon, norm_threshold(clean.norm(dim=-1))) is recon
    assert keep_outliers(x, recon, None) is recon


def test_layer_stats_on_planted_norms():
    patch = torch.ones(10, 100)
    patch[0, :5] = 20.0  # 5 of 1000 patch tokens at 20x the median
    prefix = torch.full((10, 2), 4.0)
    st = layer_special(3, patch, prefix)
    assert st.layer == 3 and st.median_patch_norm == 1.0 and st.outlier_threshold == OUTLIER_K
    assert st.outlier_share == 5 / 1000 and st.outlier_norm_ratio == 20.0
    assert st.prefix_share == 2 / 102 and st.prefix_norm_ratio == [4.0, 4.0]
    assert st.outlier_share_by_k == {"3": 5 / 1000, "5": 5 / 1000, "8": 5 / 1000}
    none = layer_special(0, torch.ones(4, 9), torch.ones(4, 1))
    assert none.outlier_share == 0.0 and none.outlier_norm_ratio is None


def test_prefix_names_follow_the_model():
    assert prefix_names(tiny_timm("vit_reg")) == ["cls", "reg0", "reg1"]
    assert prefix_names(tiny_timm("vit")) == ["cls"]
    assert prefix_names(tiny_own("ape")) == ["cls"]


def test_seed_stability_matches_a_permuted_copy_not_another_sae():
    a = SAE(SAEConfig(d_in=16, expansion=4, k=4, seed=0))
    b = SAE(SAEConfig(d_in=16, expansion=4, k=4, seed=0))
    perm = torch.randperm(a.d_sae, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        b.W_dec.copy_(a.W_dec[perm] + 0.01 * torch.randn_like(a.W_dec))
    same = seed_stability(a, b)
    assert same["share_matched"] == 1.0 and same["median_cos"] > 0.99
    other = seed_stability(a, SAE(SAEConfig(d_in=16, expansion=4, k=4, seed=7)))
    assert other["share_matched"] < 0.1 and other["median_cos"] < 0.9


@pytest.mark.slow
def test_include_special_trains_on_the_prefix_tokens_too(tmp_path):
    """A timm ViT with CLS + 2 registers: by default the SAE trains on the 16 patch tokens per image only;
    with include_special each batch also gets its 3-in-16 share of the prefix tokens."""
    from vitpos.experiments.sae_run import run_sae

    surface = tiny_timm("vit_reg")
    def run(name: str, include: bool):
        return run_sae(surface, 0, data="shapes", k=4, expansion=2, n_train_images=64, n_eval_images=8, epochs=1,
                       batch_tokens=256, out=tmp_path / name, include_special=include)[0]

    plain, special = run("plain", False), run("special", True)
    assert plain.train_tokens == 64 * 16 and not plain.include_special
    assert special.train_tokens == 64 * 16 + 4 * (256 * 3 // 16) and special.include_special
    assert special.run["special_tokens"] == "included" and plain.run["special_tokens"].startswith("outliers excluded")
