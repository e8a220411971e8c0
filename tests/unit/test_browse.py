"""`vitpos browse`: the one-pass collection equals brute force over every code, whatever the batch
size; the page is self-contained and escaped; it runs on a timm model with CLS + registers."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import tiny_own, tiny_timm
from vitpos.browse import browse_sae
from vitpos.browse.collect import _merge_topk, collect, heatmaps
from vitpos.browse.page import LEVELS, page_data, quantise, render_page
from vitpos.data import DatasetInfo, TensorImageDataset
from vitpos.hooks import capture
from vitpos.models.surface import Site
from vitpos.sae import SAE, SAEConfig, score_codes

GROUPS = {"ab": (0, 1), "cd": (2, 3)}


def grouped_set(n: int = 37, seed: int = 0) -> TensorImageDataset:
    g = torch.Generator().manual_seed(seed)
    info = DatasetInfo(name="toy", num_classes=4, class_names=("a", "b", "c", "d"), image_size=(16, 16), in_chans=3,
                       class_groups=GROUPS)
    return TensorImageDataset(torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=g),
                              torch.randint(0, 4, (n,), generator=g), info, "test")


def all_acts(surface, site, data) -> torch.Tensor:
    with torch.no_grad(), capture(surface, [site], tokens=slice(surface.num_prefix_tokens, None)) as c:
        for x, _ in data.batches(64):
            surface(x)
    return c[str(site)]  # (n, N, D)


@pytest.fixture(scope="module")
def setup():
    surface = tiny_own("ape")
    torch.manual_seed(0)
    sae = SAE(SAEConfig(d_in=surface.width, expansion=3, k=5, seed=1)).eval()
    data = grouped_set()
    site = Site(0, "resid_post")
    acts = all_acts(surface, site, data)
    with torch.no_grad():
        return surface, sae, site, data, sae.encode(acts), acts


def test_topk_merge_keeps_the_best_and_the_earlier_image_on_ties():
    score, image, patch = torch.zeros(2, 2), torch.full((2, 2), -1), torch.full((2, 2), -1)
    z = torch.tensor([[[1.0, 0.0], [3.0, 0.0]], [[3.0, 0.0], [0.5, 0.0]]])  # (B=2 images, N=2, F=2)
    s, i, p = _merge_topk(score, image, patch, z, first=10)
    assert s[0].tolist() == [3.0, 3.0] and i[0].tolist() == [10, 11] and p[0].tolist() == [1, 0]
    assert s[1].tolist() == [0.0, 0.0] and i[1].tolist() == [-1, -1]  # latent 1 never fires: empty slots


@pytest.mark.parametrize("batch", [5, 64])
def test_collect_equals_brute_force(setup, batch):
    surface, sae, site, data, z, acts = setup
    col = collect(surface, sae, site, data, top_k=4, batch_size=batch)
    n, N, F = z.shape
    per_image, arg = z.max(1)  # (n, F)
    for f in range(F):
        want = sorted((-float(per_image[i, f]), i) for i in range(n) if per_image[i, f] > 0)[:4]
        got = [(-float(s), int(i)) for s, i in zip(col.top_score[f], col.top_image[f], strict=True) if i >= 0]
        assert got == want
        for i, p in zip(col.top_image[f], col.top_patch[f], strict=True):
            if i >= 0:
                assert z[i, p, f] == per_image[i, f]
    fires = (z > 0).sum((0, 1)).double()
    mean_fire = z.double().sum((0, 1)) / fires.clamp_min(1)
    torch.testing.assert_close(col.mean_act, mean_fire.float())
    ref = score_codes([z], surface.grid)
    torch.testing.assert_close(col.scores.eta2_row, ref.eta2_row)
    torch.testing.assert_close(col.scores.cell_means, ref.cell_means)
    assert col.scores.row_features == ref.row_features and col.scores.mixed_features == ref.mixed_features
    labels = data.labels
    assert col.group_mean is not None and col.group_names == list(GROUPS)
    for j, ids in enumerate(GROUPS.values()):
        sel = torch.isin(labels, torch.tensor(ids))
        torch.testing.assert_close(col.group_mean[:, j], z[sel].double().mean((0, 1)).float())
    torch.testing.assert_close(col.patch_norms, acts.norm(dim=-1))
    assert col.n_images == n


def test_heatmaps_are_the_winners_codes(setup):
    surface, sae, site, data, z, acts = setup
    images, latents = torch.tensor([3, 0, 3, 36]), torch.tensor([2, 5, 7, 0])
    got = heatmaps(surface, sae, site, data, images, latents, batch_size=2)
    torch.testing.assert_close(got, z[images, :, latents])


def test_quantise_maps_zero_and_top_to_the_ends():
    assert quantise(torch.tensor([0.0, 1.0, 2.0, -1.0]), 2.0) == LEVELS[0] + LEVELS[32] + LEVELS[63] + LEVELS[0]
    assert quantise(torch.zeros(3), 0.0) == LEVELS[0] * 3


def test_page_escapes_every_string_and_loads_nothing(setup, tmp_path):
    surface, sae, site, data, _, _ = setup
    col = collect(surface, sae, site, data, top_k=2)
    evil = "</script><script>alert(1)</script>&<b>"
    F, k = col.top_score.shape
    doc = page_data(col, torch.zeros(F * k, surface.num_patches), {0: "iVBORw0KGgo="},
                    {"model": evil, "layer": 0, "site": "resid_post", "grid": list(surface.grid), "counts": {}},
                    [evil, "b", "c", "d"], None)
    path = render_page(doc, tmp_path / "p" / "index.html")
    page = path.read_text()
    assert evil not in page and "<script>alert" not in page
    assert "http://" not in page and "https://" not in page and "src=\"/" not in page
    block = page.split('id="data">', 1)[1].split("</script>", 1)[0]
    back = json.loads(block)
    assert back["classes"][0] == evil and back["meta"]["model"] == evil
    assert "&lt;/script&gt;" in page.split("<body>", 1)[0]  # the <title>, through html.escape
    assert len(back["lat"]["map"]) == F and all(len(m) == surface.num_patches for m in back["lat"]["map"])


@pytest.mark.slow
def test_browse_a_timm_model_with_cls_and_registers(tmp_path):
    """The SAE sees patch tokens only; sae.json names the prefix tokens, the page marks them."""
    from vitpos.experiments.sae_run import run_sae

    surface = tiny_timm("vit_reg")
    assert surface.num_prefix_tokens == 3
    result, _ = run_sae(surface, 0, data="shapes", k=4, expansion=2, n_train_images=64, n_eval_images=24, epochs=1,
                        batch_tokens=256, out=tmp_path / "sae")
    assert result.special_tokens is not None and result.special_tokens.prefix == ["cls", "reg0", "reg1"]
    assert len(result.special_tokens.layers) == surface.depth
    assert result.fidelity is not None and 0 <= result.fidelity.dense_frac <= 1
    info = browse_sae(surface, tmp_path / "sae", tmp_path / "page", top_k=3)
    page = (tmp_path / "page" / "index.html").read_text()
    data = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
    assert data["meta"]["grid"] == list(surface.grid) and info["latents"] == 2 * surface.width
    assert "cls" in data["meta"]["special"] and "reg1" in data["meta"]["special"]
    for ex in data["lat"]["ex"]:
        assert all(len(e[2]) == surface.num_patches and 0 <= e[3] < surface.num_patches for e in ex)
    assert set(data["img"]) == {str(e[0]) for ex in data["lat"]["ex"] for e in ex}


def test_browse_refuses_a_folder_without_an_sae(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vitpos.cli", "browse", str(tmp_path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "vitpos sae" in lines[0]
    assert not (tmp_path / "o").exists()


def test_report_shows_fidelity_special_tokens_and_links_the_browser():
    import copy

    from conftest import GOLDEN
    from vitpos.experiments.registry import BY_NAME
    from vitpos.report.sections import CLAIM_RULES
    from vitpos.results.sae_run import SAEResult

    golden = copy.deepcopy(GOLDEN["models"]["builtin:ape"]["sae"])
    doc = {**golden, "layer": 1, "fvu": 0.01, "logit_kl": 0.00012, "include_special": False,
           "excluded_outlier_tokens": 0, "browser": "artifacts/x y/sae/browse/index.html",
           "fidelity": {"dense_threshold": 0.1, "dense_frac": 0.115, "dense_frac_by_threshold": {"0.05": 0.2},
                        "stability": {"seed": 0, "other_seed": 1, "cos_threshold": 0.9, "share_matched": 0.25,
                                      "median_cos": 0.5, "other_fvu": 0.02}},
           "special_tokens": {"k": 5.0, "prefix": ["cls", "reg0"], "n_images": 8, "layers": [
               {"layer": 1, "median_patch_norm": 1.0, "prefix_share": 0.1, "prefix_norm_ratio": [0.5, 7.0],
                "outlier_threshold": 5.0, "outlier_share": 0.001, "outlier_norm_ratio": None,
                "outlier_share_by_k": {}}]}}
    out = BY_NAME["sae"].section(SAEResult.model_validate(doc), CLAIM_RULES)
    assert '<a href="artifacts/x%20y/sae/browse/index.html">' in out
    assert "11.5%" in out and "25.0%" in out and "0.00012" in out  # dense, stability, KL
    assert "reg0 7.00×" in out and "norm &gt; 5× median at this layer</td><td>0.1%</td>" in out
    assert "norm &gt; 5× the median training-token norm (&gt; " in out and "left out: 0 per epoch" in out
    # an sae.json without them: no link, no new rows
    old = BY_NAME["sae"].section(SAEResult.model_validate(golden), CLAIM_RULES)
    assert old.count("<a ") == 0 and "dense latents" not in old and "prefix tokens" not in old


def test_the_browser_header_tells_the_held_out_factor_from_the_training_rule():
    """DINOv2's run trains at 4x the median norm while the held-out share is measured at 5x: the header
    once put both (and the red dashes, drawn at the training threshold) under 5x. It also carries the
    seed grid's positional agreement beside the whole-dictionary stability."""
    from vitpos.browse import _agreement, _special_line

    special = {"k": 5.0, "prefix": ["cls"], "layers": [{"layer": 0, "prefix_norm_ratio": [0.83],
                                                        "outlier_share": 0.0}]}
    line = _special_line(special, 0, False, 4.0)
    assert line is not None and "norm > 5x median: 0.00 % of held-out tokens" in line
    assert "norm > 4x the median training-token norm are left out of SAE training and red-dashed" in line
    assert "norm > 5x the median training" in (_special_line(special, 0, False, None) or "")  # the default rule
    doc = {"d_sae": 1536, "sweep": {"stability": [{"d_sae": 3072, "row_agreement": 0.9, "col_agreement": 0.71},
                                                  {"d_sae": 1536, "row_agreement": 0.91, "col_agreement": 0.83}]}}
    assert _agreement(doc) == [0.91, 0.83] and _agreement({"d_sae": 1536}) is None


# --- what browse refuses before the pass ------------------------------------------------------------

def _sae_folder(tmp_path, surface, sae, **edits):
    """An SAE folder as `vitpos sae` writes it (weights + sae.json, both recording the model's digest)."""
    from vitpos.io import write_json

    d = tmp_path / "sae"
    sae.save(d, model_weights=edits.pop("file_weights", surface.weights_digest()))
    doc = {"model": surface.spec, "layer": 0, "site": "resid_post", "data": "toy", "tokens": 37 * 16,
           "row_features": [0], "col_features": [1], "mixed_features": [], "run": {"weights": surface.weights_digest()}}
    for k, v in edits.items():
        if v is None:
            doc.pop(k)
        else:
            doc[k] = v
    write_json(d / "sae.json", doc)
    return d


def _no_pass(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("the browse pass ran before the refusal")

    monkeypatch.setattr("vitpos.browse.collect.collect", fail)


@pytest.mark.parametrize(("edit", "key"), [({"data": None}, "'data'"), ({"tokens": "many"}, "'tokens'"),
                                           ({"layer": [1]}, "'layer'"), ({"model": None}, "'model'"),
                                           ({"top1": 7.5}, "'top1'")])
def test_browse_refuses_a_bad_sae_json_naming_the_file_and_key(edit, key, setup, tmp_path, monkeypatch):
    from vitpos.browse import sae_doc
    from vitpos.errors import VitposError

    surface, sae, _, data, _, _ = setup
    d = _sae_folder(tmp_path, surface, sae, **edit)
    _no_pass(monkeypatch)
    with pytest.raises(VitposError) as e:
        browse_sae(surface, d, tmp_path / "page", data=data, doc=sae_doc(d))
    assert str(d / "sae.json") in str(e.value) and key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("where", ["sae.json", "sae.safetensors"])
def test_browse_refuses_an_sae_of_another_model(where, setup, tmp_path, monkeypatch):
    from vitpos.errors import VitposError

    surface, sae, _, data, _, _ = setup
    other = "0123456789abcdef"
    d = (_sae_folder(tmp_path, surface, sae, run={"weights": other}) if where == "sae.json" else
         _sae_folder(tmp_path, surface, sae, file_weights=other))
    _no_pass(monkeypatch)
    with pytest.raises(VitposError, match=f"{where} records an SAE of model weights {other}"):
        browse_sae(surface, d, tmp_path / "page", data=data)
    assert not (tmp_path / "page").exists()


def test_browse_warns_on_an_sae_that_records_no_model(setup, tmp_path):
    surface, _, _, data, _, _ = setup
    torch.manual_seed(0)
    sae = SAE(SAEConfig(d_in=surface.width, expansion=3, k=5, seed=1)).eval()  # no model_weights recorded
    d = _sae_folder(tmp_path, surface, sae, run={}, file_weights=None)
    said: list[str] = []
    browse_sae(surface, d, tmp_path / "page", data=data, top_k=2, log=said.append)
    assert len(said) == 1 and said[0].startswith("warning: ") and "records no digest" in said[0]
    assert (tmp_path / "page" / "index.html").is_file()


def test_browse_refuses_a_top_k_beyond_memory_and_an_out_file(setup, tmp_path, monkeypatch):
    from vitpos.errors import VitposError
    from vitpos.runtime.memory import available_bytes

    surface, sae, _, data, _, _ = setup
    d = _sae_folder(tmp_path, surface, sae)
    _no_pass(monkeypatch)
    have = available_bytes()
    assert have is not None and have > 0
    huge = 1_000_000_000
    with pytest.raises(VitposError, match=f"--top-k {huge} .* needs about .* GiB of memory, more than the"):
        browse_sae(surface, d, tmp_path / "page", data=data, top_k=huge)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(VitposError, match="is a file"):
        browse_sae(surface, d, tmp_path / "file", data=data)
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "page").exists()


def test_browse_refuses_latents_beyond_the_sae_and_more_images_than_the_split(setup, tmp_path, monkeypatch):
    """Issue 49: sae.json naming latent 999 of a smaller SAE (another SAE's file) and --images beyond the
    test split were browsed without a word (the latter on fewer images than asked for)."""
    from vitpos.errors import VitposError

    surface, sae, _, data, _, _ = setup
    d = _sae_folder(tmp_path, surface, sae, row_features=[0, 999])
    _no_pass(monkeypatch)
    with pytest.raises(VitposError, match=re.escape(f"key 'row_features' names latent 999, but the SAE in "
                                                    f"sae.safetensors has {sae.d_sae} (0..{sae.d_sae - 1})")):
        browse_sae(surface, d, tmp_path / "page", data=data)
    d = _sae_folder(tmp_path / "ok", surface, sae)
    with pytest.raises(VitposError, match=re.escape(f"--images {len(data) + 1}: the test split of the data has "
                                                    f"{len(data)} images; pass --images {len(data)} or less")):
        browse_sae(surface, d, tmp_path / "page", data=data, images=len(data) + 1)
    assert not (tmp_path / "page").exists()
