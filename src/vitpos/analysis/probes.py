"""Linear position probes: can a linear read-out recover a patch token's row / column?

Conventions (shared across vitpos):
  * features are (num_images, num_patches, D), tokens in patch order, prefix tokens (CLS,
    registers) already stripped by the caller;
  * patch n of an H x W grid has row n // W and column n % W.

A probe (`LinearProbe`) is multinomial logistic regression on standardised features, the same
objective as scikit-learn's LogisticRegression; `vitpos.analysis.lbfgs` fits it (the solver and
why it is hand-written are described there).

`fit_position_probes` splits BY IMAGE (test images never reach training), chooses l2 per probe
on a validation split of the training images, refits on all training images and reports test
accuracy, plus a Hewitt & Liang-style control task (`vitpos.analysis.probe_split.control_labels`,
with the split and the token sample) and its selectivity.
Its results are `ProbeResult`s (`vitpos.analysis.probe_results`); `probe_layers` runs it on
several layers with one split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from vitpos.analysis.lbfgs import Design, all_finite, fit_softmax_heads, standardise_stats, standardised_design
from vitpos.analysis.linear_probe import EVAL_CHUNK_TOKENS, LinearProbe, check_features, folded
from vitpos.analysis.probe_results import LayerProbeResults, ProbeResult
from vitpos.analysis.probe_split import ProbeSplit, check_grid, control_labels, sample_train_tokens, split_images
from vitpos.errors import VitposError
from vitpos.runtime.device import full_precision, resolve_device  # device/amp plumbing (docs/distributed.md)

DEFAULT_L2_GRID: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# Training tokens are capped: L-BFGS cost is linear in tokens, and ~50k tokens already give
# hundreds of examples per position for a few thousand parameters per probe.
DEFAULT_MAX_TRAIN_TOKENS = 50_000


# --------------------------------------------------------------------------------------------
# Labels (the control task's, the split and the token sample: `vitpos.analysis.probe_split`)
# --------------------------------------------------------------------------------------------


def position_labels(grid: Sequence[int], target: str) -> torch.Tensor:
    """(H*W,) int64 label of each patch for target 'row' (n // W) or 'col' (n % W)."""
    h, w = check_grid(grid)
    n = torch.arange(h * w)
    if target == "row":
        return n // w
    if target == "col":
        return n % w
    raise VitposError(f"target must be 'row' or 'col', got {target!r}")


# --------------------------------------------------------------------------------------------
# Position probes on one layer
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def _head_correct(
    features: torch.Tensor,
    images: torch.Tensor,
    heads: list[tuple[torch.Tensor, torch.Tensor]],
    labels: list[torch.Tensor],
    mean: torch.Tensor,
    std: torch.Tensor,
    device: torch.device,
) -> torch.Tensor:
    """(images, heads) int64: patches of each image each head labels correctly, streaming images
    to bound memory."""
    raw = [folded(w, b, mean, std) for w, b in heads]
    w = torch.cat([f[0] for f in raw], 1)
    b = torch.cat([f[1] for f in raw])
    sizes = [f[1].numel() for f in raw]
    num_patches = features.shape[1]
    labels = [y.to(device) for y in labels]
    parts = []
    per_chunk = max(1, EVAL_CHUNK_TOKENS // num_patches)
    for i in range(0, images.numel(), per_chunk):
        x = features[images[i : i + per_chunk]].to(device, torch.float32)
        logits = torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(x.shape[0], num_patches, -1)
        parts.append(torch.stack([(part.argmax(-1) == labels[h]).sum(-1).cpu()
                                  for h, part in enumerate(logits.split(sizes, -1))], dim=1))
    return torch.cat(parts) if parts else torch.zeros(0, len(heads), dtype=torch.long)


@dataclass(frozen=True)
class ProbeSample:
    """Which tokens a `fit_position_probes` call reads, fixed from the image ids and the seed alone
    (before any activation exists): the training tokens (`train_images`, `train_patches`, one pair
    per token, in the order the fit stacks them) and every token of the split's val and test images.

    A capture can therefore keep only these (`ProbeTokens`) instead of every token of every image."""

    ids: list[Any]
    num_patches: int
    seed: int
    split: ProbeSplit
    train_images: torch.Tensor
    train_patches: torch.Tensor

    @property
    def whole_images(self) -> torch.Tensor:
        """Sorted rows whose every token the fit reads (validation and test images)."""
        return torch.cat([self.split.val, self.split.test]).sort().values


def probe_sample(image_ids: Sequence[Any] | torch.Tensor | int, num_patches: int, *, seed: int = 0,
                 test_frac: float = 0.25, val_frac: float = 0.2,
                 max_train_tokens: int | None = DEFAULT_MAX_TRAIN_TOKENS) -> ProbeSample:
    """The `ProbeSample` of fit_position_probes(features, ..., image_ids, seed, test_frac, val_frac,
    max_train_tokens) on features with `num_patches` patches (image_ids: ids per row, or a row count)."""
    ids = list(range(image_ids)) if isinstance(image_ids, int) else (
        image_ids.reshape(-1).tolist() if isinstance(image_ids, torch.Tensor) else list(image_ids))
    split = split_images(ids, seed=seed, test_frac=test_frac, val_frac=val_frac)
    img_idx, patch_idx = sample_train_tokens(split.train, num_patches, max_train_tokens, seed=seed)
    return ProbeSample(ids=ids, num_patches=int(num_patches), seed=int(seed), split=split, train_images=img_idx,
                       train_patches=patch_idx)


@dataclass(frozen=True)
class ProbeTokens:
    """Everything a fit reads of one layer's (num_images, N, D) features: `train` (T, D), the sampled
    training tokens in `sample` order, and `val` / `test` (images, N, D), every token of the split's
    validation / test images in split order. A fit on these equals the fit on the full features."""

    sample: ProbeSample
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor

    @classmethod
    def gather(cls, features: torch.Tensor, sample: ProbeSample) -> ProbeTokens:
        """The tokens `sample` names, taken from the full (num_images, N, D) features."""
        split = sample.split
        return cls(sample, features[sample.train_images, sample.train_patches], features[split.val],
                   features[split.test])

    @classmethod
    def from_whole(cls, sample: ProbeSample, train: torch.Tensor, whole: torch.Tensor,
                   whole_rows: torch.Tensor) -> ProbeTokens:
        """`train` plus val / test picked out of `whole` (images, N, D), the images `whole_rows` (sorted)."""
        return cls(sample, train, whole[rows_in(whole_rows, sample.split.val)],
                   whole[rows_in(whole_rows, sample.split.test)])


def rows_in(kept_rows: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Positions of `rows` within the sorted `kept_rows` (every row must be kept)."""
    pos = torch.searchsorted(kept_rows, rows)
    if rows.numel() and (int(pos.max()) >= kept_rows.numel() or not bool((kept_rows[pos] == rows).all())):
        raise VitposError("rows asked for were not kept by the capture; keep them (Keep.images) before the forward")
    return pos


@full_precision  # the fit stays float32 under an outer --amp autocast (model forwards)
def fit_position_probes(
    features: torch.Tensor,
    grid: Sequence[int],
    image_ids: Sequence[Any] | torch.Tensor | None = None,
    *,
    seed: int = 0,
    test_frac: float = 0.25,
    val_frac: float = 0.2,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    control: bool = True,
    device: str | torch.device | None = None,
    max_train_tokens: int | None = DEFAULT_MAX_TRAIN_TOKENS,
    max_iter: int = 200,
    tol: float = 1e-4,
) -> ProbeResult:
    """Fit row and column probes on (num_images, H*W, D) patch features and score them on held-out images.

    image_ids: optional id per image (row of `features`); rows sharing an id share a split.
    device: where to fit (e.g. 'cuda'); default: the features' device.
    max_train_tokens: cap on training tokens, drawn position-balanced from the training images
        only (None: use all). Validation and test always use every token of their images.
    The control probes use the l2 chosen for the real probe (same probe, control task).
    Deterministic given `seed`. The same fit from only the tokens it reads: `probe_sample`, then
    `fit_probe_tokens`.
    """
    features = check_features(features)
    h, w = check_grid(grid)
    if features.ndim != 3:
        raise VitposError(
            f"features must be (num_images, num_patches, D), got shape {tuple(features.shape)}; "
            "stack per-image patch tokens (prefix tokens stripped)"
        )
    n_img, n_patch, _ = features.shape
    _check_patches(n_patch, h, w)
    if image_ids is None:
        image_ids = list(range(n_img))
    ids = image_ids.reshape(-1).tolist() if isinstance(image_ids, torch.Tensor) else list(image_ids)
    if len(ids) != n_img:
        raise VitposError(f"image_ids has {len(ids)} entries but features have {n_img} images")
    l2_values = _check_l2_grid(l2_grid)
    sample = probe_sample(ids, n_patch, seed=seed, test_frac=test_frac, val_frac=val_frac,
                          max_train_tokens=max_train_tokens)
    return fit_probe_tokens(ProbeTokens.gather(features, sample), grid, l2_grid=l2_values, control=control,
                            device=device, max_iter=max_iter, tol=tol)


def _check_patches(n_patch: int, h: int, w: int) -> None:
    if n_patch != h * w:
        raise VitposError(
            f"features have {n_patch} patches per image but grid {h}x{w} has {h * w}; "
            "pass the model's patch grid and strip CLS/register tokens"
        )
    if h < 2 or w < 2:
        raise VitposError(f"grid {h}x{w} needs at least 2 rows and 2 columns to probe both axes")


def _check_l2_grid(l2_grid: Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(v) for v in l2_grid)
    if not values or any(not (v > 0) for v in values):
        raise VitposError(f"l2_grid must be a non-empty sequence of positive numbers, got {values}")
    return values


@full_precision
def fit_probe_tokens(
    tokens: ProbeTokens,
    grid: Sequence[int],
    *,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    control: bool = True,
    device: str | torch.device | None = None,
    max_iter: int = 200,
    tol: float = 1e-4,
) -> ProbeResult:
    """`fit_position_probes` from the tokens it reads (`ProbeTokens`; split, seed and token cap are
    the sample's): the same result, bit for bit, as the fit on the full features."""
    h, w = check_grid(grid)
    sample = tokens.sample
    _check_patches(sample.num_patches, h, w)
    for name, part in (("train", tokens.train), ("val", tokens.val), ("test", tokens.test)):
        check_features(part, f"{name} tokens")
    l2_grid = _check_l2_grid(l2_grid)
    dev = resolve_device(device) if device is not None else tokens.train.device  # accepts auto|cpu|cuda
    best, val_by_l2 = _choose_l2(tokens, (h, w), l2_grid, dev, max_iter, tol)
    fit = _refit(tokens, (h, w), best, control, dev, max_iter, tol)
    return _probe_result(sample, fit, (h, w), best, val_by_l2, l2_grid, max_iter, tol)


def _train_features(tokens: ProbeTokens, dev: torch.device) -> torch.Tensor:
    """The training tokens as float32 on `dev` (the tokens themselves when they already are: each
    step converts its own, so no step holds a copy the next one does not need)."""
    x_train = tokens.train.to(dev, torch.float32)
    if not all_finite(x_train):
        raise VitposError("features contain NaN or inf; fix the activations before probing")
    return x_train


_L2Choice = dict[str, tuple[float, float, tuple[torch.Tensor, torch.Tensor]]]  # target -> (val acc, l2, head)


def _choose_l2(tokens: ProbeTokens, grid: tuple[int, int], l2_grid: tuple[float, ...], dev: torch.device,
               max_iter: int, tol: float) -> tuple[_L2Choice, dict[str, dict[float, float]]]:
    """Step 1 of `fit_probe_tokens`: the L2 of each probe chosen on the validation images, fitting on
    the rest of the training images; the best (val accuracy, l2, head) per target and every l2's
    val accuracy."""
    h, w = grid
    sample = tokens.sample
    split, n_patch = sample.split, sample.num_patches
    val_rows = torch.arange(split.val.numel())  # the val tensor holds exactly the split's images, in split order
    targets = [position_labels(grid, "row"), position_labels(grid, "col")]
    patch_dev = sample.train_patches.to(dev)
    in_fit = torch.isin(sample.train_images, split.fit)
    x_fit = _train_features(tokens, dev)[in_fit.to(dev)]
    mean_fit, std_fit = standardise_stats(x_fit)
    xs_fit = Design(standardised_design(x_fit, mean_fit, std_fit))
    del x_fit
    y_fit = [t.to(dev)[patch_dev[in_fit.to(dev)]] for t in targets]
    val_by_l2: dict[str, dict[float, float]] = {"row": {}, "col": {}}
    best: _L2Choice = {}
    heads, memory = None, {}
    # Largest l2 first: each fit warm-starts the next, weaker-regularised one (a path).
    for l2 in sorted(set(l2_grid), reverse=True):
        heads = fit_softmax_heads(
            xs_fit, y_fit, [h, w], [l2, l2], heads, max_iter=max_iter, tol=tol, memory=memory
        )
        correct = _head_correct(tokens.val, val_rows, heads, targets, mean_fit, std_fit, dev)
        accs = (correct.sum(0).double() / (val_rows.numel() * n_patch)).tolist()
        for t, acc, head in zip(("row", "col"), accs, heads, strict=True):
            val_by_l2[t][l2] = acc
            # Strict '>' keeps the larger (safer) l2 on ties.
            if t not in best or acc > best[t][0]:
                best[t] = (acc, l2, head)
    return best, val_by_l2


class _Refit(NamedTuple):
    """Step 2 of `fit_probe_tokens`: the final heads and what reads them."""

    names: list[str]
    heads: list[tuple[torch.Tensor, torch.Tensor]]
    labels: list[torch.Tensor]
    sizes: list[int]
    l2s: list[float]
    mean: torch.Tensor
    std: torch.Tensor
    test_correct: torch.Tensor  # (test images, heads)
    test_acc: dict[str, float]


def _refit(tokens: ProbeTokens, grid: tuple[int, int], best: _L2Choice, control: bool, dev: torch.device,
           max_iter: int, tol: float) -> _Refit:
    """Step 2 of `fit_probe_tokens`: refit on all training images with the chosen l2 (the control
    probes share it), scored on the test images."""
    h, w = grid
    sample = tokens.sample
    x_train = _train_features(tokens, dev)
    mean, std = standardise_stats(x_train)
    xs_train = Design(standardised_design(x_train, mean, std))
    del x_train
    targets = {"row": position_labels(grid, "row"), "col": position_labels(grid, "col")}
    ctrl = {"row": control_labels(grid, "row", sample.seed), "col": control_labels(grid, "col", sample.seed)}
    names = ["row", "col"] + (["row_control", "col_control"] if control else [])
    labels = [targets["row"], targets["col"]] + ([ctrl["row"], ctrl["col"]] if control else [])
    l2s = [best["row"][1], best["col"][1]] * (2 if control else 1)
    sizes = [h, w] * (2 if control else 1)
    init = [best["row"][2], best["col"][2]] + ([None, None] if control else [])
    patch_dev = sample.train_patches.to(dev)
    final = fit_softmax_heads(
        xs_train, [y.to(dev)[patch_dev] for y in labels], sizes, l2s, init, max_iter=max_iter, tol=tol
    )
    del xs_train
    test_rows = torch.arange(sample.split.test.numel())
    test_correct = _head_correct(tokens.test, test_rows, final, labels, mean, std, dev)  # (test images, heads)
    accs = (test_correct.sum(0).double() / (test_rows.numel() * sample.num_patches)).tolist()
    return _Refit(names, final, labels, sizes, l2s, mean, std, test_correct, dict(zip(names, accs, strict=True)))


def _probe_result(sample: ProbeSample, fit: _Refit, grid: tuple[int, int], best: _L2Choice,
                  val_by_l2: Mapping[str, Mapping[float, float]], l2_grid: tuple[float, ...], max_iter: int,
                  tol: float) -> ProbeResult:
    """Step 3 of `fit_probe_tokens`: the fitted heads as probes, and the result."""
    h, w = grid
    split, ids = sample.split, sample.ids
    probes = {}
    for name, (wt, bs), y, k, l2 in zip(fit.names, fit.heads, fit.labels, fit.sizes, fit.l2s, strict=True):
        probe = LinearProbe(k, l2, position_labels=y, max_iter=max_iter, tol=tol)
        probe._set(wt, bs, fit.mean, fit.std)
        probes[name] = probe

    def ids_of(rows: torch.Tensor) -> list[Any]:
        return list(dict.fromkeys(ids[r] for r in rows.tolist()))

    test_acc = fit.test_acc
    rc, cc = test_acc.get("row_control"), test_acc.get("col_control")
    return ProbeResult(
        row_acc=test_acc["row"],
        col_acc=test_acc["col"],
        row_control_acc=rc,
        col_control_acc=cc,
        row_selectivity=None if rc is None else test_acc["row"] - rc,
        col_selectivity=None if cc is None else test_acc["col"] - cc,
        chance_row=1.0 / h,
        chance_col=1.0 / w,
        l2_row=best["row"][1],
        l2_col=best["col"][1],
        n_train_images=len(ids_of(split.train)),
        n_test_images=len(ids_of(split.test)),
        n_train_tokens=int(sample.train_patches.numel()),
        grid=(h, w),
        l2_grid=l2_grid,
        row_val_acc=[val_by_l2["row"][v] for v in l2_grid],
        col_val_acc=[val_by_l2["col"][v] for v in l2_grid],
        train_image_ids=ids_of(split.train),
        val_image_ids=ids_of(split.val),
        test_image_ids=ids_of(split.test),
        row_probe=probes["row"],
        col_probe=probes["col"],
        row_control_probe=probes.get("row_control"),
        col_control_probe=probes.get("col_control"),
        test_correct={"row": fit.test_correct[:, 0], "col": fit.test_correct[:, 1]},
    )


# --------------------------------------------------------------------------------------------
# Position probes across layers
# --------------------------------------------------------------------------------------------


def probe_layers(
    features_by_layer: dict[int, torch.Tensor], grid: Sequence[int], **kw: Any
) -> LayerProbeResults:
    """`fit_position_probes` on each layer's (num_images, H*W, D) features, all with one image split.

    Keyword arguments go to `fit_position_probes`; the same seed gives every layer the same
    train/val/test images, so layers are compared on identical data.
    """
    if not isinstance(features_by_layer, dict) or not features_by_layer:
        raise VitposError("features_by_layer must be a non-empty dict {layer: (num_images, num_patches, D) tensor}")
    layers = sorted(features_by_layer)
    shapes = {layer: tuple(getattr(features_by_layer[layer], "shape", ())) for layer in layers}
    n_imgs = {s[0] if s else None for s in shapes.values()}
    if len(n_imgs) != 1:
        raise VitposError(f"every layer must hold the same images, got shapes {shapes}")
    results = []
    for layer in layers:
        try:
            results.append(fit_position_probes(features_by_layer[layer], grid, **kw))
        except VitposError as e:
            raise VitposError(f"layer {layer}: {e}") from e
    return LayerProbeResults(layers=[int(layer) for layer in layers], results=results)
