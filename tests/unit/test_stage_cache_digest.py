"""A stage-cache entry is served only as it was written (issue 49: plausible-but-wrong cached numbers)."""

import json

from vitpos.study.cache import StageCache


def test_an_entry_is_served_as_written_and_refused_once_edited(tmp_path):
    said: list[str] = []
    cache = StageCache(tmp_path, force=False, log=said.append)
    path = tmp_path / "eval.json"
    result = {"top1": 0.5, "n": 8, "per_class": {"10": 0.5, "2": 0.5}, "top1_ci95": [0.25, 0.75]}
    cache.put(path, {"stage": "eval", "settings": {"images": 8}}, result, 1.5)
    assert cache.get(path) == result and said == []
    doc = json.loads(path.read_text())
    for edit in (("result", "top1", 0.625), ("seconds", None, 9.0), ("key", "stage", "probe")):
        changed = json.loads(json.dumps(doc))
        part, name, value = edit
        if name is None:
            changed[part] = value
        else:
            changed[part][name] = value
        entry = tmp_path / f"edited-{part}.json"
        entry.write_text(json.dumps(changed, indent=2))
        assert cache.get(entry) is None, edit  # a plausible number, but not the one computed
        assert "does not match the digest" in said[-1] and "recomputing it" in said[-1]
    legacy = tmp_path / "legacy.json"  # written before entries had digests: recomputed, said so
    legacy.write_text(json.dumps({k: doc[k] for k in ("key", "seconds", "result")}))
    assert cache.get(legacy) is None and "before entries had digests" in said[-1]
    reformatted = tmp_path / "reformatted.json"  # whitespace and key order are not content
    reformatted.write_text(json.dumps(dict(reversed(list(doc.items()))), separators=(",", ":")))
    assert cache.get(reformatted) == result
