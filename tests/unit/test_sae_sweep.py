"""The SAE layer as a sweep: one SAE, C1 and C2 per layer, a bootstrapped choice of layer and a rule over it."""

from __future__ import annotations

import pytest
import torch

from conftest import toy_set
from vitpos.claims.layers import over_plausible
from vitpos.experiments.registry import LAYER_MEASURES
from vitpos.experiments.sae_sweep import run_sae_sweep, selection_frequency, sweep_layers


def test_sweep_layers_every_layer_but_the_last_or_an_even_subset():
    assert sweep_layers(4) == [0, 1, 2]
    assert sweep_layers(1) == []
    sub = sweep_layers(24, max_layers=6)
    assert sub[0] == 0 and sub[-1] == 22 and len(sub) == 6 and sub == sorted(sub)


def test_selection_frequency_finds_a_clear_winner_and_splits_a_tie():
    g = torch.Generator().manual_seed(0)
    clear = torch.stack([torch.zeros(200), (torch.rand(200, generator=g) < 0.5).float(), torch.zeros(200)])
    f = selection_frequency(clear)
    assert f[1] == 1.0 and float(f.sum()) == pytest.approx(1.0)
    same = (torch.rand(200, generator=g) < 0.3).float()
    f = selection_frequency(torch.stack([same, same.clone(), torch.zeros(200)]))  # an exact tie: no float tie-break
    assert f.tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_the_claim_over_the_curve_needs_every_plausible_layer():
    assert over_plausible(["holds", "holds"]) == "holds"  # layers 0, 1 plausible (layer 2's failure not read)
    assert over_plausible(["holds", "fails"]) == "inconclusive"  # depends on the layer picked
    assert over_plausible(["fails", "fails"]) == "fails"
    assert over_plausible([]) == "fails"  # no plausible layer: nothing holds


def test_run_sae_sweep_starts_at_the_embedding_and_measures_every_layer(tmp_path):
    from conftest import TINY
    from vitpos.data.resolve import dataset_for
    from vitpos.models.own import OwnViTConfig, build_own_vit
    from vitpos.models.spec import OwnSurface
    from vitpos.store.reader import ActivationStore

    torch.manual_seed(0)
    cfg = OwnViTConfig(pe="ape", **{**TINY, "depth": 3})
    s = OwnSurface(build_own_vit(cfg).eval(), "tiny:ape3", cfg)
    torch.manual_seed(1)
    with torch.no_grad():  # predictions that vary from image to image (timm's init gives one class)
        for p in s.model.parameters():
            p.normal_(0, 0.3)
    kw = dict(k=4, expansion=2, n_train_images=64, n_eval_images=48, epochs=1, batch_tokens=256, buffer_tokens=512)
    data = toy_set(96)
    res = run_sae_sweep(s, data, LAYER_MEASURES, sae_kw=kw, permute_images=48, out=tmp_path)
    # the embedding (resid_pre of block 0) first, then block outputs 0, 1 (depth 3: the last has no downstream)
    assert res.layers == [0, 1] and res.sites == ["embed", "L0", "L1"]
    assert [(p.layer, p.site) for p in res.points] == [(0, "resid_pre"), (0, "resid_post"), (1, "resid_post")]
    assert res.layer_rule == "the embedding, then every block output 0..1"
    embed = res.points[0]
    assert embed.sae is not None and (embed.sae.layer, embed.sae.site) == (0, "resid_pre")
    assert embed.permute is not None and (embed.permute.layer, embed.permute.site) == (0, "resid_pre")
    # its SAE trained on the APE-added tokens before block 0: the store it read holds embed_tokens' patch tokens
    store = ActivationStore(tmp_path / "embed" / "acts")
    assert store.sites == ["blocks.0.resid_pre"]
    x = next(iter(dataset_for(s, data, "train", limit=8).batches(8)))[0]
    with torch.no_grad():
        tokens = s.embed_tokens(x)
        after = s.run_blocks(tokens, 0, 1)
    npt = s.num_prefix_tokens
    stored = store.load_site("blocks.0.resid_pre", max_images=8)
    assert torch.allclose(stored, tokens[:, npt:], atol=1e-5) and not torch.allclose(stored, after[:, npt:], atol=1e-2)
    # the embedding is one more site to the selection; each point carries its position budget
    assert sum(p.selection_frequency for p in res.points) == pytest.approx(1.0)
    assert res.plausible_sites and set(res.plausible_sites) <= set(res.sites)
    assert res.selected_site in (None, *res.sites) and res.c1 is None and res.c2 is None  # the sweep decides nothing
    from vitpos.claims.c1 import CLAIM as C1
    from vitpos.claims.c2 import CLAIM as C2
    from vitpos.results.ape_permute import position_budget

    for p in res.points:  # each site read with the claims' own rules, from the typed results kept there
        assert C1.at_layer("m", p).result in ("holds", "fails", "inconclusive")
        assert C2.at_layer("m", p).numbers["all_positional_drop"] == p.all_positional_drop
        assert p.permute is not None and p.all_positional_budget == position_budget(p.permute, "all_positional")
        assert p.permute.prefix_tokens == npt and p.permute.prefix_edited is False
    for d in ("embed", "L0", "L1"):
        assert (tmp_path / d / "sae.json").is_file()
