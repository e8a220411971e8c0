"""Bounded captures (vitpos.analysis.kept): they keep exactly the floats a full capture would give
the consumer, the fits on them equal the fits on full captures bit for bit, and what they hold does
not grow with the number of images."""

from __future__ import annotations

import pytest
import torch
from test_shared_prefix import _planted, differences

from vitpos.analysis.forward import accuracy_report, capture_layers
from vitpos.analysis.kept import Keep, TokenKeeper
from vitpos.analysis.probes import ProbeTokens, fit_position_probes, fit_probe_tokens, probe_sample, rows_in
from vitpos.analysis.stats import accuracy_interval
from vitpos.errors import VitposError
from vitpos.experiments.common import capture_condition, condition_context, probe_condition
from vitpos.models.surface import Site

MODEL = ("own", "rope-axial")


@pytest.fixture(scope="module")
def planted():
    return _planted(MODEL)


@pytest.mark.parametrize("cap", [None, 700])
def test_kept_tokens_equal_full_capture_then_sampling(planted, cap):
    s, data = planted
    sites = [Site(layer, "resid_post") for layer in range(s.depth)]
    context = condition_context(s, ("row",), 2)
    full, labels, logits = capture_layers(s, data, sites, context=context)
    sample = probe_sample(len(data), s.num_patches, seed=3, max_train_tokens=cap)
    keep = {site: Keep.probe(sample) for site in sites}
    kept, k_labels, k_logits, _ = capture_condition(s, data, context, keep)
    assert torch.equal(k_labels, labels) and torch.equal(k_logits, logits)
    with kept:
        for site in sites:
            feats = full[str(site)]
            assert torch.equal(kept.tokens(str(site)), feats[sample.train_images, sample.train_patches])
            assert torch.equal(kept.images(str(site)), feats[keep[site].images])
            assert torch.equal(torch.cat(list(kept.iter_images(str(site), 7))), feats[keep[site].images])
    # 300 images: the kept images are the val and test 40 % only; the capped sample is smaller than the train set
    assert len(keep[sites[0]].images) == len(sample.split.val) + len(sample.split.test) < len(data)
    if cap is not None:
        assert len(sample.train_images) <= cap < len(sample.split.train) * s.num_patches


def _same_result(a, b) -> list[str]:
    diffs = differences(a.to_dict(), b.to_dict(), tol=0.0)
    for name in ("row_probe", "col_probe", "row_control_probe", "col_control_probe"):
        pa, pb = getattr(a, name), getattr(b, name)
        for k, v in pa.state_dict().items():
            if not torch.equal(v, pb.state_dict()[k]):
                diffs.append(f"{name}.{k}")
    return diffs


@pytest.mark.parametrize("cap", [None, 300])
def test_fit_probe_tokens_equals_fit_position_probes(cap):
    g = torch.Generator().manual_seed(0)
    grid, n = (4, 5), 40
    rows = torch.arange(20) // 5
    feats = torch.randn(n, 20, 6, generator=g)
    feats[..., 0] += rows.float()  # a row code, so accuracies are not chance
    want = fit_position_probes(feats, grid, seed=5, max_train_tokens=cap)
    sample = probe_sample(n, 20, seed=5, max_train_tokens=cap)
    got = fit_probe_tokens(ProbeTokens.gather(feats, sample), grid)
    assert not _same_result(want, got)
    assert want.row_acc > 0.5
    # from the images a capture keeps: the same again
    keep = Keep.probe(sample)
    whole = feats[keep.images]
    again = fit_probe_tokens(ProbeTokens.from_whole(sample, feats[sample.train_images, sample.train_patches], whole,
                                                    keep.images), grid)
    assert not _same_result(want, again)


def _probe_condition_full(surface, dataset, context, base_probes, seed, layers, max_train_tokens):
    """The former probe_condition: every token of every layer captured, then fit_position_probes."""
    sites = [Site(layer, "resid_post") for layer in layers]
    acts, labels, logits = capture_layers(surface, dataset, sites, context=context)
    doc: dict = {k: [] for k in ("row_acc", "col_acc", "row_acc_orig_probe", "col_acc_orig_probe", "row_acc_ci95",
                                 "col_acc_ci95")}
    for layer in layers:
        feats = acts[str(Site(layer, "resid_post"))]
        kw = {}
        if base_probes is not None:
            kw["l2_grid"] = tuple(sorted({base_probes[layer].l2_row, base_probes[layer].l2_col}))
        res = fit_position_probes(feats, surface.grid, seed=seed, control=False, max_train_tokens=max_train_tokens,
                                  **kw)
        doc["row_acc"].append(res.row_acc)
        doc["col_acc"].append(res.col_acc)
        doc["row_acc_ci95"].append(res.acc_ci95("row"))
        doc["col_acc_ci95"].append(res.acc_ci95("col"))
        if base_probes is not None:
            test = torch.as_tensor(base_probes[layer].test_image_ids)
            doc["row_acc_orig_probe"].append(base_probes[layer].row_probe.accuracy(feats[test]))
            doc["col_acc_orig_probe"].append(base_probes[layer].col_probe.accuracy(feats[test]))
        else:
            doc["row_acc_orig_probe"].append(res.row_acc)
            doc["col_acc_orig_probe"].append(res.col_acc)
    rep = accuracy_report(logits.argmax(-1), labels, dataset.info)
    correct = logits.argmax(-1) == labels
    return {**doc, "top1": rep["top1"], "top1_ci95": accuracy_interval(correct), "per_group": rep["per_group"]}


def test_probe_condition_equals_the_full_capture_path(planted):
    s, data = planted
    layers = list(range(s.depth))
    base = probe_condition(s, data, None, seed=1, max_train_tokens=900)
    assert not differences(_probe_condition_full(s, data, None, None, 1, layers, 900), base["doc"], tol=0.0)
    off = condition_context(s, ("row",))
    got = probe_condition(s, data, off, base["probes"], seed=1, max_train_tokens=900)["doc"]
    want = _probe_condition_full(s, data, off, base["probes"], 1, layers, 900)
    assert not differences(want, got, tol=0.0)
    assert max(abs(a - b) for a, b in zip(base["doc"]["row_acc"], got["row_acc"], strict=True)) > 0.05  # teeth


def _feed(keeper: TokenKeeper, feats: dict[str, torch.Tensor], batch: int) -> None:
    n = next(iter(feats.values())).shape[0]
    for i in range(0, n, batch):
        for key, f in feats.items():
            keeper(key, f[i:i + batch])


def test_memory_held_does_not_grow_with_images():
    """What a bounded capture holds: layers x the token cap x D, plus a fixed store buffer; a full
    capture holds layers x images x grid x D."""
    grid, d, cap, buffer = (4, 4), 8, 200, 32 * 2**10
    held, buffers = {}, {}
    for n_layers in (2, 4):
        for n in (150, 600):
            g = torch.Generator().manual_seed(n)
            feats = {f"blocks.{i}.resid_post": torch.randn(n, 16, d, generator=g) for i in range(n_layers)}
            sample = probe_sample(n, 16, seed=0, max_train_tokens=cap)
            keep = Keep.probe(sample)
            keeper = TokenKeeper(dict.fromkeys(feats, keep), grid, buffer_bytes=buffer)
            _feed(keeper, feats, batch=64)
            with keeper.finish() as kept:
                for key, f in feats.items():  # and the right floats
                    assert torch.equal(kept.tokens(key), f[sample.train_images, sample.train_patches])
                    assert torch.equal(kept.images(key), f[keep.images])
                held[n_layers, n] = kept.peak_bytes
                # the store's buffer: what is held beyond the sampled tokens (<= cap per layer)
                buffers[n_layers, n] = kept.peak_bytes - n_layers * len(sample.train_images) * d * 4
            assert kept.peak_bytes <= n_layers * cap * d * 4 + buffer
    for (n_layers, n), peak in held.items():
        if n == 600:
            assert peak < n_layers * n * 16 * d * 4 / 4  # far below the full capture
    assert buffers[2, 150] == buffers[2, 600] == buffers[4, 150] == buffers[4, 600] <= buffer  # flat in images


def test_images_that_fit_the_buffer_are_held_in_memory_and_equal_the_stores(tmp_path):
    """A site whose kept images all fit its buffer share is held in memory (no store written, read and
    deleted); one that does not streams to a store. Both give back the same floats."""
    grid, n = (4, 4), 90
    g = torch.Generator().manual_seed(0)
    feats = {f"blocks.{i}.resid_post": torch.randn(n, 16, 8, generator=g) for i in range(2)}
    keep = Keep.whole(range(3, n, 2))
    got = {}
    for name, buffer in (("memory", 2**20), ("store", 4 * 2**10)):
        spill = tmp_path / name
        spill.mkdir()
        keeper = TokenKeeper(dict.fromkeys(feats, keep), grid, buffer_bytes=buffer, spill_dir=spill)
        _feed(keeper, feats, batch=16)
        with keeper.finish() as kept:
            got[name] = {k: (kept.images(k), torch.cat(list(kept.iter_images(k, 7)))) for k in feats}
            assert (list(spill.iterdir()) == []) == (name == "memory")  # a store only when it does not fit
            assert kept.peak_bytes <= buffer
        assert list(spill.iterdir()) == []  # closed: nothing left
    for k, f in feats.items():
        for name in got:
            assert torch.equal(got[name][k][0], f[keep.images]) and torch.equal(got[name][k][1], f[keep.images])


def test_keep_refuses_what_was_not_captured():
    keeper = TokenKeeper({"a": Keep.whole([1, 5])}, (2, 2))
    keeper("a", torch.zeros(3, 4, 2))
    with pytest.raises(VitposError, match="names image 5 but only 3"):
        keeper.finish()
    keeper.abort()
    with pytest.raises(VitposError, match="were not kept"):
        rows_in(torch.tensor([0, 2]), torch.tensor([1]))
    with pytest.raises(VitposError, match="has no Keep"):
        TokenKeeper({}, (2, 2))("b", torch.zeros(1, 4, 2))
