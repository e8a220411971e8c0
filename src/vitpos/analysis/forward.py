"""In-memory forwards of a dataset through a surface: captured sites, predictions and accuracy.

Small builtin studies keep patch activations in memory (`capture_layers`; large ones stream to the
on-disk activation store instead, ``vitpos.store.capture``). Prefix tokens are dropped: probes and
SAEs only ever see patch tokens. Top-1 accuracy of a surface on a dataset split, optionally under a
hook context, is `evaluate` / `predict` + `accuracy_report`.

Every forward that yields logits checks first that they are logits over the data's classes
(`ModelSurface.check_classifier`): a headless model (outputs = pooled features) or a classifier
with another class count is refused in one line that names the fix (`vitpos head`, `--head`).
Captures that only want activations (probes, SAE training, feature scores) pass
``check_classifier=False``; their third return value is then the raw model output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch

from vitpos.data.resolve import dataset_for
from vitpos.errors import VitposError
from vitpos.hooks import capture
from vitpos.models import load_model
from vitpos.models.surface import ModelSurface, Site, expand_sites
from vitpos.progress import progress_bar


def _data_label(dataset) -> str:
    return str(getattr(dataset.info, "name", "the data"))


def forward_batches(surface: ModelSurface, dataset, batch_size: int = 256, progress: bool = False,
                    desc: str = "forward", check_classifier: bool = True
                    ) -> Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yield (images, labels, logits) batch by batch under whatever hooks are active.

    check_classifier=False: the outputs are not used as class logits (may be pooled features)."""
    if check_classifier:
        surface.check_classifier(dataset.info, _data_label(dataset))
    total = (len(dataset) + batch_size - 1) // batch_size
    with progress_bar(enabled=progress) as bar:
        task = bar.add_task(desc, total=total)
        dev = surface.device  # images follow the model (e.g. onto a GPU)
        for x, y in dataset.batches(batch_size):
            yield x, y, surface(x.to(dev, non_blocking=True))
            bar.update(task, advance=1)


def capture_layers(surface: ModelSurface, dataset, sites: list[Site] | str, *, batch_size: int = 256,
                   context: Callable[[], AbstractContextManager] | None = None, progress: bool = False,
                   desc: str = "capture", check_classifier: bool = True
                   ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Patch activations (n_images, N, D) per site, plus labels and logits, under an optional hook context.

    check_classifier=False for activations only: the third value is then the raw model output
    (pooled features on a headless model), never to be read as class logits."""
    site_list = expand_sites(sites, surface.depth) if isinstance(sites, str) else sites
    npt = surface.num_prefix_tokens
    labels, logits = [], []
    with (context() if context else nullcontext()), capture(surface, site_list, tokens=slice(npt, None)) as cache:
        for _, y, out in forward_batches(surface, dataset, batch_size, progress, desc, check_classifier):
            labels.append(y)
            logits.append(out)
        acts = {str(s): cache[str(s)] for s in site_list}
    return acts, torch.cat(labels), torch.cat(logits)


def capture_patch_tokens(spec: str, site: str, layer: int, data: str = "shapes", split: str = "test",
                         n_images: int = 500, batch_size: int = 256) -> torch.Tensor:
    """(n_images, num_patches, D) activations of one site/layer — the benchmark-friendly entry point."""
    surface = load_model(spec)
    ds = dataset_for(surface, data, split, limit=n_images)
    acts, _, _ = capture_layers(surface, ds, [Site(layer, site)], batch_size=batch_size, check_classifier=False)
    return acts[str(Site(layer, site))]


def accuracy_report(preds: torch.Tensor, labels: torch.Tensor, info) -> dict:
    """top1 plus per-class and per-class-group accuracies (fractions in [0, 1]).

    `preds` must come from logits that passed the classifier check (`predict`, `capture_layers`);
    a prediction outside the data's classes is refused here as well."""
    k = len(info.class_names)
    if len(preds) and (int(preds.min()) < 0 or int(preds.max()) >= k):
        raise VitposError(f"predictions reach class {int(preds.max())} but {info.name} has {k} classes: the outputs "
                          "are not logits over this data's classes; fit a head with `vitpos head` and pass --head DIR")
    correct = (preds == labels).float()
    per_class = {}
    for c, name in enumerate(info.class_names):
        mask = labels == c
        if mask.any():
            per_class[name] = float(correct[mask].mean())
    groups = {}
    for g, ids in info.class_groups.items():
        mask = torch.isin(labels, torch.tensor(ids))
        if mask.any():
            groups[g] = float(correct[mask].mean())
    return {"top1": float(correct.mean()), "n": int(len(labels)), "per_class": per_class, "per_group": groups}


@torch.no_grad()
def predict(surface, dataset, batch_size: int = 256, context: Callable[[], AbstractContextManager] | None = None,
            progress: bool = False, desc: str = "eval") -> tuple[torch.Tensor, torch.Tensor]:
    preds, labels = [], []
    with context() if context else nullcontext():
        for _, y, logits in forward_batches(surface, dataset, batch_size, progress, desc):
            preds.append(logits.argmax(-1))
            labels.append(y)
    return torch.cat(preds), torch.cat(labels)


def evaluate(surface, dataset, batch_size: int = 256, context=None, progress: bool = False) -> dict:
    preds, labels = predict(surface, dataset, batch_size, context, progress)
    return accuracy_report(preds, labels, dataset.info)


__all__ = ["accuracy_report", "capture_layers", "capture_patch_tokens", "evaluate", "forward_batches", "predict"]
