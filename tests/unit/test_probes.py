import math

import numpy as np
import pytest
import torch

from vitpos.analysis.linear_probe import LinearProbe
from vitpos.analysis.probe_split import control_labels, sample_train_tokens, split_images
from vitpos.analysis.probes import fit_position_probes, position_labels, probe_layers
from vitpos.errors import VitposError

H = W = 8
N = H * W


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The test machine is shared; one thread avoids oversubscription stalls on small matmuls.
    # Module scope, so it is set before the module-scoped fits below too: results are
    # deterministic for a given thread count, but BLAS rounding differs between thread counts.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def planted(n_images=120, d=32, seed=0, row_scale=3.0, col_scale=0.0, noise=1.0, emb=None):
    """Features = row embedding (+ optional column embedding) + Gaussian noise, random directions."""
    g = torch.Generator().manual_seed(seed)
    row_emb, col_emb = emb if emb is not None else (torch.randn(H, d, generator=g), torch.randn(W, d, generator=g))
    n = torch.arange(N)
    code = row_scale * row_emb[n // W] + col_scale * col_emb[n % W]
    return code + noise * torch.randn(n_images, N, d, generator=g), (row_emb, col_emb)


@pytest.fixture(scope="module")
def row_only():
    feats, emb = planted()
    return feats, emb, fit_position_probes(feats, (H, W), seed=0)


def test_planted_row_code_is_found_and_column_is_chance(row_only):
    _, _, r = row_only
    assert r.chance_row == pytest.approx(1 / H) and r.chance_col == pytest.approx(1 / W)
    assert r.row_acc >= 0.95
    # 30 test images x 64 tokens: chance +- 0.04 is > 5 standard errors.
    assert abs(r.col_acc - r.chance_col) < 0.04
    # A row-only code carries nothing about the row-balanced control labels.
    assert abs(r.row_control_acc - r.chance_row) < 0.04
    assert abs(r.col_control_acc - r.chance_col) < 0.04
    assert r.row_selectivity == pytest.approx(r.row_acc - r.row_control_acc)
    assert r.row_selectivity > 0.8
    assert abs(r.col_selectivity) < 0.06
    assert len(r.row_val_acc) == len(r.l2_grid) and r.l2_row in r.l2_grid


def test_split_is_by_image_and_exposed(row_only):
    feats, _, r = row_only
    train, val, test = set(r.train_image_ids), set(r.val_image_ids), set(r.test_image_ids)
    assert train.isdisjoint(test)
    assert val < train
    assert train | test == set(range(feats.shape[0]))
    assert r.n_train_images == len(train) == 90 and r.n_test_images == len(test) == 30
    assert r.n_train_tokens == 90 * N  # below the cap: every training token is used


def test_grouped_image_ids_never_straddle_splits():
    feats, _ = planted(n_images=60)
    ids = [f"img{i // 3}" for i in range(60)]  # three crops per source image
    r = fit_position_probes(feats, (H, W), image_ids=ids, control=False, l2_grid=(1e-2,))
    assert set(r.train_image_ids).isdisjoint(r.test_image_ids)
    assert len(r.train_image_ids) + len(r.test_image_ids) == 20
    assert r.row_control_acc is None and r.row_selectivity is None and r.row_control_probe is None
    s = split_images(ids, seed=0)
    for part in (s.train, s.test):
        groups = {ids[i] for i in part.tolist()}
        assert sum(ids.count(gid) for gid in groups) == part.numel()


def test_deterministic_given_seed(row_only):
    feats, _, r = row_only
    again = fit_position_probes(feats, (H, W), seed=0)
    assert again.to_dict() == r.to_dict()
    assert again.test_image_ids == r.test_image_ids
    assert torch.equal(again.row_probe.weight, r.row_probe.weight)
    other = fit_position_probes(feats, (H, W), seed=1, control=False, l2_grid=(1e-2,))
    assert other.test_image_ids != r.test_image_ids


def test_probe_transfers_across_conditions(row_only):
    _, emb, r = row_only
    same_code, _ = planted(n_images=20, seed=5, emb=emb)
    new_code, _ = planted(n_images=20, seed=6)  # different random row directions
    probe = r.row_probe
    pred = probe.predict(same_code)
    assert pred.shape == (20, N) and pred.dtype == torch.long
    assert probe.accuracy(same_code) >= 0.95
    assert probe.accuracy(new_code) < 0.5
    # Explicit labels give the same answer as position-derived ones.
    labels = position_labels((H, W), "row").expand(20, N)
    assert probe.accuracy(same_code, labels) == probe.accuracy(same_code)
    # Token-layout input works too.
    assert torch.equal(probe.predict(same_code.reshape(-1, same_code.shape[-1])), pred.reshape(-1))


def test_state_dict_round_trip(row_only, tmp_path):
    from vitpos.io import read_safetensors, write_safetensors

    feats, _, r = row_only
    write_safetensors(tmp_path / "probe.safetensors", r.col_probe.state_dict())
    loaded = LinearProbe.from_state_dict(read_safetensors(tmp_path / "probe.safetensors"))
    assert loaded.l2 == r.l2_col and loaded.num_classes == W
    assert torch.equal(loaded.predict(feats[:5]), r.col_probe.predict(feats[:5]))
    assert loaded.accuracy(feats[:5]) == r.col_probe.accuracy(feats[:5])


def test_full_position_code_lets_control_memorise():
    # Each position its own random direction: the linear probe can memorise any position->label
    # map, so the control is far above chance and selectivity is well below row_acc - chance.
    g = torch.Generator().manual_seed(3)
    pos = 3.0 * torch.randn(N, 96, generator=g)
    feats = pos + torch.randn(80, N, 96, generator=g)
    r = fit_position_probes(feats, (H, W), l2_grid=(1e-3,))
    assert r.row_acc >= 0.95 and r.col_acc >= 0.95
    assert r.row_control_acc > 0.8 and r.col_control_acc > 0.8
    assert r.row_selectivity < 0.2


def test_linear_probe_matches_sklearn_objective():
    from sklearn.linear_model import LogisticRegression

    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 10, generator=g)
    y = (x[:, :3] @ torch.randn(3, 4, generator=g) + 0.5 * torch.randn(600, 4, generator=g)).argmax(1)
    l2 = 1e-2
    probe = LinearProbe(4, l2, tol=1e-7, max_iter=500).fit(x, y)
    xs = ((x - probe.mean) / probe.std).numpy().astype(np.float64)
    sk = LogisticRegression(C=1.0 / (l2 * len(y)), tol=1e-10, max_iter=2000).fit(xs, y.numpy())
    # Softmax logits are defined up to a per-row constant: compare centred weights.
    ours = probe.weight.numpy() - probe.weight.numpy().mean(1, keepdims=True)
    theirs = sk.coef_.T - sk.coef_.T.mean(1, keepdims=True)
    np.testing.assert_allclose(ours, theirs, atol=2e-3)
    assert (probe.predict(x).numpy() == sk.predict(xs)).mean() == 1.0


def test_control_labels_are_balanced_fixed_maps():
    for grid in ((8, 8), (4, 6)):
        h, w = grid
        for target, k in (("row", h), ("col", w)):
            lab = control_labels(grid, target, seed=0)
            assert lab.shape == (h * w,) and int(lab.min()) == 0 and int(lab.max()) == k - 1
            assert torch.equal(lab, control_labels(grid, target, seed=0))
            table = lab.reshape(h, w)
            along = table if target == "row" else table.T  # each true class's positions
            for line in along:
                counts = torch.bincount(line, minlength=k)
                assert int(counts.max() - counts.min()) <= 1  # label independent of the true class
    assert not torch.equal(control_labels((8, 8), "row"), control_labels((8, 8), "col"))
    assert not torch.equal(control_labels((8, 8), "row", 0), control_labels((8, 8), "row", 1))


def test_position_labels_convention():
    assert position_labels((2, 3), "row").tolist() == [0, 0, 0, 1, 1, 1]
    assert position_labels((2, 3), "col").tolist() == [0, 1, 2, 0, 1, 2]


def test_token_cap_is_balanced_and_stays_in_train():
    train = torch.tensor([1, 4, 7, 9])
    img, patch = sample_train_tokens(train, N, max_tokens=128, seed=0)
    assert img.numel() == patch.numel() == 128
    assert set(img.tolist()) <= set(train.tolist())
    assert torch.bincount(img, minlength=10)[train].tolist() == [32, 32, 32, 32]
    counts = torch.bincount(patch, minlength=N)
    assert int(counts.max() - counts.min()) <= 1
    feats, _ = planted(n_images=40)
    r = fit_position_probes(feats, (H, W), max_train_tokens=500, control=False, l2_grid=(1e-2,))
    assert r.n_train_tokens <= 500 and r.row_acc >= 0.9


def test_probe_layers_json_shape():
    weak, emb = planted(n_images=60, row_scale=0.3, noise=1.0)
    strong, _ = planted(n_images=60, row_scale=3.0, emb=emb, seed=1)
    res = probe_layers({3: strong, 1: weak}, (H, W), l2_grid=(1e-2, 1.0))
    js = res.to_json("resid_post")
    assert js["layers"] == [1, 3] and js["site"] == "resid_post"
    for key in ("row_acc", "col_acc", "row_control_acc", "col_control_acc", "row_selectivity", "col_selectivity"):
        assert len(js[key]) == 2
    assert js["chance_row"] == 1 / H and js["chance_col"] == 1 / W
    assert js["row_acc"][1] > js["row_acc"][0] + 0.2
    assert res[1].test_image_ids == res[3].test_image_ids  # one split for all layers
    import json

    json.dumps(js)
    with pytest.raises(VitposError, match="layer 5 was not probed"):
        res[5]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda f: fit_position_probes(f.reshape(-1, f.shape[-1]), (H, W)), r"\(num_images, num_patches, D\)"),
        (lambda f: fit_position_probes(f, (7, 8)), "64 patches per image but grid 7x8 has 56"),
        (lambda f: fit_position_probes(f, (8,)), "grid must be a pair"),
        (lambda f: fit_position_probes(f.long(), (H, W)), "float tensor"),
        (lambda f: fit_position_probes(f[:2], (H, W)), "at least 3 distinct images"),
        (lambda f: fit_position_probes(f, (H, W), image_ids=[0, 1]), "image_ids has 2 entries"),
        (lambda f: fit_position_probes(f, (H, W), l2_grid=()), "l2_grid"),
        (lambda f: fit_position_probes(f, (H, W), test_frac=1.5), "test_frac"),
        (lambda f: fit_position_probes(torch.full_like(f, math.nan), (H, W)), "NaN"),
        (lambda f: probe_layers({0: f, 1: f[:10]}, (H, W)), "same images"),
        (lambda f: LinearProbe(H).predict(f), "not fitted"),
        (lambda f: LinearProbe(H).fit(f), "labels are required"),
    ],
)
def test_input_errors_are_clear(call, match):
    feats, _ = planted(n_images=12)
    with pytest.raises(VitposError, match=match):
        call(feats)


def test_probe_rejects_wrong_width(row_only):
    _, _, r = row_only
    with pytest.raises(VitposError, match="D=5 but the probe was fitted on D=32"):
        r.row_probe.predict(torch.randn(2, N, 5))
    with pytest.raises(VitposError, match=r"features must be \(num_images, 64, D\)"):
        r.row_probe.accuracy(torch.randn(2, 10, 32))


def test_plot_probe_curves_writes_png(tmp_path, row_only):
    from vitpos.plots.probe import plot_probe_curves
    from vitpos.results.probe import ProbeSiteResult

    res = ProbeSiteResult(
        layers=[0, 1, 2], site="resid_post", row_acc=[0.2, 0.6, 0.9], col_acc=[0.1, 0.3, 0.5],
        chance_row=1 / H, chance_col=1 / W, row_control_acc=[0.13, 0.15, 0.2], col_control_acc=[None, None, None],
        row_selectivity=[None] * 3, col_selectivity=[None] * 3, l2_row=[1.0] * 3, l2_col=[1.0] * 3,
        n_train_images=10, n_test_images=5, n_images=15,
        content_baseline={"row_acc": 0.1, "col_acc": 0.1, "note": "no positional input"})
    out = plot_probe_curves(res, tmp_path / "sub" / "probe.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["probe.png"]  # no temp file left
    with pytest.raises(VitposError, match="3 values for 2 layers"):
        plot_probe_curves(res.model_copy(update={"layers": [0, 1]}), tmp_path / "x.png")


def test_direct_weight_is_the_logit_change_of_an_added_component():
    """Probe logits are affine in the features: adding c moves them by c @ direct_weight()."""
    from vitpos.analysis.linear_probe import LinearProbe

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 6, generator=g), torch.randint(0, 3, (200,), generator=g)
    probe = LinearProbe(3).fit(x, y)
    c = torch.randn(200, 6, generator=g)
    torch.testing.assert_close(probe.logits(x + c) - probe.logits(x), c @ probe.direct_weight(), atol=1e-4, rtol=1e-4)


def test_probe_accuracy_intervals_resample_test_images(row_only):
    """Per-image accuracies average to the reported accuracy exactly; the interval holds it, is
    narrow where every image is decoded and wide around chance for the column (no code)."""
    _, _, r = row_only
    for axis in ("row", "col"):
        per_image = r.per_image_acc(axis)
        assert per_image.shape == (r.n_test_images,)
        assert float(per_image.mean()) == pytest.approx(getattr(r, f"{axis}_acc"), abs=1e-12)
        lo, hi = r.acc_ci95(axis)
        assert lo <= getattr(r, f"{axis}_acc") <= hi
    assert r.to_dict()["row_acc_ci95"] == r.acc_ci95("row")
    col_lo, col_hi = r.acc_ci95("col")
    assert col_lo < r.chance_col + 0.1 and col_hi - col_lo > 0.01
