"""The study's stage cache: OUT/stages/<model>/<stage>-<key>.json, keyed by a content hash of
(model weights or hub spec, data, seed, the stage's settings, the stage's version: its experiment's
`version` and those of the experiments it reads, `vitpos.experiments.registry.stage_versions`;
the head stage's `HEAD_VERSION`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from vitpos.errors import VitposError
from vitpos.io import read_json, write_json
from vitpos.study.config import RunConfig


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


class StageCache:
    def __init__(self, root: Path, force: bool):
        self.root, self.force = root, force

    def path(self, model_slug: str, stage: str, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return self.root / "stages" / model_slug / f"{stage}-{digest}.json"

    def get(self, path: Path) -> dict | None:
        if self.force or not path.is_file():
            return None
        try:
            return read_json(path)["result"]
        except (VitposError, KeyError):
            return None  # a damaged cache entry is recomputed

    def put(self, path: Path, key: dict, result: dict, seconds: float) -> None:
        write_json(path, {"key": key, "seconds": seconds, "result": result})
