"""The study's `head` stage: a classifier on the pooled features for a model whose own does not fit the data.

Runs before every experiment, only for a model whose outputs are not logits over the data's
classes (headless backbones, another class count) and for which the config's `heads:` names no
head dir. The head is fitted with ``vitpos.analysis.heads.fit_head`` into OUT/artifacts/<slug>/head
and attached to the surface (``ModelSurface.with_head``), so eval, the SAE splice, ape-permute and
the RoPE tests all measure top-1 through it. A head given in `heads:` is attached as it is and
recorded the same way (source "given"). results.json shows it as the model entry's `head`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from vitpos.models.head import Head
from vitpos.results.base import Result

# The head stage's version (in its cache key, as an experiment's `version`): bump it when the fit
# changes, and a rerun refits the head; the stages measured through it follow its new digest.
HEAD_VERSION = 1


class HeadResult(Result):
    """Where the head came from, where it lives and how well it does (from its head.json)."""

    source: Literal["fitted", "given"]
    head_dir: str
    digest: str  # Head.digest(): keys every later stage measured through this head
    feature_site: str
    classes: list[str]
    l2: float
    val_top1: float
    test_top1: float
    n_train_images: int
    n_val_images: int
    n_test_images: int
    reason: str  # why the model's own classifier was not used

    @classmethod
    def of(cls, head: Head, head_dir: str | Path, source: Literal["fitted", "given"], reason: str) -> HeadResult:
        i = head.info
        return cls(source=source, head_dir=str(head_dir), digest=head.digest(), feature_site=i.feature_site,
                   classes=list(i.classes), l2=i.l2, val_top1=i.val_top1, test_top1=i.test_top1,
                   n_train_images=i.n_train_images, n_val_images=i.n_val_images, n_test_images=i.n_test_images,
                   reason=reason)


__all__ = ["HEAD_VERSION", "HeadResult"]
