"""The study's stage cache: OUT/stages/<model>/<stage>-<key>.json, keyed by a content hash of
(model weights or hub spec, data, seed, the stage's settings, the stage's version: its experiment's
`version` and those of the experiments it reads, `vitpos.experiments.registry.stage_versions`;
the head stage's `HEAD_VERSION`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from vitpos.errors import VitposError
from vitpos.io import finite_number, read_json, write_json
from vitpos.study.config import RunConfig
from vitpos.study.sanity import impossible


def code_fingerprint() -> str:
    """Content hash of every module of the installed vitpos package and the torch version: the key of
    results no stage version describes (the planted-model validation table reads rules, models and
    experiments alike), so any code change recomputes them."""
    import torch

    import vitpos

    root = Path(vitpos.__file__).parent
    h = hashlib.sha256(torch.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def model_fingerprint(spec: str, cfg: RunConfig) -> str:
    """Content identity of a model: its weights file hash, or hub spec + weights source."""
    from vitpos.models.spec import weights_file

    path = weights_file(spec, cfg.checkpoints.get(spec))
    if path is None:
        return hashlib.sha256(f"{spec}|pretrained={cfg.pretrained}".encode()).hexdigest()[:16]
    if not path.is_file():
        return hashlib.sha256(spec.encode()).hexdigest()[:16]  # load_model will give the clear error
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


RECOMPUTE = "recomputing it"


def entry_digest(doc: dict) -> str:
    """Content hash of a cache entry's key, seconds and result: an entry edited after it was written (a number
    changed by hand, a file half-copied) no longer matches the digest it was written with."""
    body = {k: doc.get(k) for k in ("key", "seconds", "result")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


class StageCache:
    """log: where a damaged entry is reported (it is then recomputed); None: silently."""

    def __init__(self, root: Path, force: bool, log: Callable[[str], None] | None = None):
        self.root, self.force, self.log = root, force, log
        self._reported: set[Path] = set()  # the plan and the run both read an entry: one warning each

    def path(self, model_slug: str, stage: str, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return self.root / "stages" / model_slug / f"{stage}-{digest}.json"

    def get(self, path: Path, check: Callable[[dict], str | None] | None = None) -> dict | None:
        """The entry's result; None (recompute) when it is missing, unparsable, changed since it was written
        (its digest), or holds a value that cannot be right (`vitpos.study.sanity.impossible`, and `check`'s
        problem when given)."""
        if self.force or not path.is_file():
            return None
        try:
            doc = read_json(path, fix=RECOMPUTE)
        except VitposError as e:
            self._warn(path, f"damaged stage-cache entry: {e}")
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
            self.damaged(path, "no result object")
        elif not isinstance(doc.get("key"), dict) or not finite_number(doc.get("seconds")) or doc["seconds"] < 0:
            self.damaged(path, "its key or seconds are missing or wrong")
        elif doc.get("digest") != entry_digest(doc):
            self.damaged(path, "its content does not match the digest it was written with (edited after it was "
                         "written, or written by a vitpos before entries had digests)")
        elif (problem := impossible(doc["result"]) or (check(doc["result"]) if check is not None else None)):
            self.damaged(path, problem)
        else:
            return doc["result"]
        return None

    def damaged(self, path: Path, why: str) -> None:
        """A damaged cache entry is recomputed, and said so (once)."""
        self._warn(path, f"damaged stage-cache entry: {path} ({' '.join(why.split())[:200]}); {RECOMPUTE}")

    def _warn(self, path: Path, message: str) -> None:
        if self.log is not None and path not in self._reported:
            self._reported.add(path)
            self.log(f"warning: {message}")

    def put(self, path: Path, key: dict, result: dict, seconds: float) -> None:
        doc = json.loads(json.dumps({"key": key, "seconds": seconds, "result": result}))  # as get() will read it
        write_json(path, {**doc, "digest": entry_digest(doc)})
