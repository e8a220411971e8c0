"""The SAE stage's training store: a given one (`vitpos capture`) checked against the model, site and
data (`open_train_store`), or the train split captured by run_sae itself (`_capture_train_store`)."""

from __future__ import annotations

from pathlib import Path

from vitpos.data.resolve import data_name
from vitpos.errors import VitposError
from vitpos.experiments.common import sweep_batch
from vitpos.io import read_json
from vitpos.models.surface import ModelSurface, Site
from vitpos.runtime.options import RunOptions


def open_train_store(store, surface: ModelSurface, site: Site, data):
    """Open a store made by `vitpos capture` for SAE training; one-line VitposError unless it holds
    `site` of `surface`'s model, captured on `data`'s train images."""
    from vitpos.store.capture import CAPTURE_VERSION, spot_check_store
    from vitpos.store.reader import ActivationStore

    st = ActivationStore(store)
    fix = (f"capture one with `vitpos capture --model {surface.spec} --sites {site} --data {data_name(data)} "
           "--split train`")
    meta = st.meta
    if meta.get("model") != surface.spec:
        raise VitposError(f"--store {st.dir} holds activations of model {meta.get('model')!r}, not {surface.spec!r}; "
                          f"pass the matching --model or {fix}")
    if meta.get("weights") not in (None, surface.weights_digest()):
        raise VitposError(f"--store {st.dir} was captured from other weights of {surface.spec} (weights digest "
                          f"{meta.get('weights')}, now {surface.weights_digest()}); {fix}")
    if meta.get("capture_version") != CAPTURE_VERSION:
        raise VitposError(f"--store {st.dir} was captured by capture version {meta.get('capture_version')}, this "
                          f"vitpos captures version {CAPTURE_VERSION} (the site values may differ); {fix}")
    if str(site) not in st.sites:
        raise VitposError(f"--store {st.dir} has no site {site} (it has {', '.join(st.sites)}); pass a matching "
                          f"--layer/--site or {fix}")
    if tuple(st.grid) != tuple(surface.grid) or st.d.get(str(site)) != surface.width:
        raise VitposError(f"--store {st.dir} has grid {st.grid} x D {st.d.get(str(site))}, the model "
                          f"{tuple(surface.grid)} x D {surface.width}; {fix}")
    if isinstance(data, str) and meta.get("data") != data:
        raise VitposError(f"--store {st.dir} was captured on data {meta.get('data')!r} but --data is {data!r} (its "
                          f"test split is the held-out set); pass --data {meta.get('data')}")
    if meta.get("split") == "test":
        raise VitposError(f"--store {st.dir} holds the test split, which is the SAE's held-out evaluation set; {fix}")
    if st.num_images == 0:
        raise VitposError(f"--store {st.dir} holds no images; {fix}")
    # every shard's first image recomputed: a shard copied in from another store is refused, not trained on
    spot_check_store(st, surface, site, data, f"re-create the store by rerunning the capture with --force, or {fix}")
    return st


def _capture_train_store(surface: ModelSurface, site: Site, data, n_train_images: int, acts_dir: Path, progress: bool,
                         force: bool, options: RunOptions | None = None, keep_prefix: bool = False):
    """The train split's patch tokens at `site` into the store `acts_dir` (resumes an interrupted one;
    a store there from other settings is replaced: it is run_sae's own scratch)."""
    from vitpos.store.capture import CAPTURE_VERSION, capture_to_store
    from vitpos.store.manifest import MANIFEST
    from vitpos.store.reader import ActivationStore

    if not force and (acts_dir / MANIFEST).is_file():
        try:
            manifest = read_json(acts_dir / MANIFEST)
            meta = manifest.get("meta", {})
            force = ((meta.get("model"), meta.get("weights"), meta.get("data"), meta.get("limit"),
                      meta.get("capture_version"))
                     != (surface.spec, surface.weights_digest(), data_name(data), n_train_images, CAPTURE_VERSION)
                     or bool(manifest.get("keep_prefix", False)) != keep_prefix)
        except Exception:  # unreadable: start over
            force = True
    opts = options if options is not None else RunOptions()
    capture_to_store(surface, data, "train", str(site), acts_dir, limit=n_train_images, batch_size=sweep_batch(surface),
                     force=force, progress=progress, device=opts.device, amp=opts.amp, keep_prefix=keep_prefix)
    return ActivationStore(acts_dir)
