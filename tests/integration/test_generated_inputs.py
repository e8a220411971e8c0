"""Generated bad inputs: every file kind vitpos reads, mutated, and every numeric option, pushed to
its edges, through the CLI in process (`vitpos.cli.main`). The contract, for every case: exit 0 with
a sane result, or exit 2 with exactly one `error:` line on stderr, no traceback, and `--out` left
exactly as it was before the command.

The mutations come from a seeded generator (`MUTATIONS`, `NUMBERS`), not a hand-kept list: a new
file kind or option is covered by adding it to `FILE_KINDS` / `OPTIONS`. Everything runs on a tiny
own model (32 px, 4 x 4 patches, width 32, 2 blocks) and a 4-class image folder of a few dozen
images, so the whole module stays within seconds per command.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from vitpos.cli import main
from vitpos.io import write_json

CLASSES = ["a", "b", "c", "d"]
SEED = 30  # the generator's seed: the same cases on every run


# --- the inputs ------------------------------------------------------------------------------------

def _imagefolder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2), ("test", 4)):
        for c in CLASSES:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


@dataclass
class World:
    root: Path
    data: str  # imagefolder:PATH
    model: Path  # own model dir (pe none: no APE / RoPE stages in a run)
    ape: Path  # own APE model dir, for the SAE and ape-permute
    head: Path
    sae: Path
    config: Path
    run_out: Path  # a finished tiny `vitpos run` (its stage cache and results.json)
    train_out: Path  # an interrupted `vitpos train --quick` (checkpoint after epoch 1 of 2)
    store: Path  # a `vitpos capture` store of the train split


def _own_model(path: Path, pe: str, data: str, classes: list[str] = CLASSES) -> Path:
    from vitpos.models.checkpoint import save_own_model
    from vitpos.models.own import OwnViTConfig, build_own_vit

    torch.manual_seed(0)
    cfg = OwnViTConfig.model_validate(dict(pe=pe, img_size=32, patch_size=8, num_classes=4, embed_dim=32, depth=2,
                                           num_heads=2))
    save_own_model(path, build_own_vit(cfg), cfg, extra={"train": {"data": data}, "classes": classes})
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    from vitpos.models import load_model
    from vitpos.models.head import Head, HeadInfo
    from vitpos.sae import SAE, SAEConfig
    from vitpos.train import train

    root = tmp_path_factory.mktemp("generated")
    data = f"imagefolder:{_imagefolder(root / 'imgs')}"
    model = _own_model(root / "model", "none", data)
    ape = _own_model(root / "ape", "ape", data)
    surface = load_model(str(model))
    g = torch.Generator().manual_seed(0)
    info = HeadInfo(model=str(model), weights=surface.weights_digest(), data=data, classes=CLASSES, num_classes=4,
                    width=32, l2=1.0, l2_grid=[1.0], val_top1_by_l2=[0.5], val_top1=0.5, test_top1=0.5,
                    n_train_images=24, n_val_images=8, n_test_images=16, seed=0)
    Head(torch.randn(4, 32, generator=g), torch.zeros(4), info).save(root / "head")
    ape_surface = load_model(str(ape))
    sae_dir = root / "sae"
    SAE(SAEConfig(d_in=32, expansion=2, k=4)).save(sae_dir, model_weights=ape_surface.weights_digest())
    write_json(sae_dir / "sae.json", {"model": str(ape), "layer": 1, "site": "resid_post", "row_features": [0, 1],
                                      "col_features": [2], "mixed_features": [], "run": {
                                          "weights": ape_surface.weights_digest()}})
    # the run's model was trained on other classes: the study fits a head (an artifact in the results)
    run_model = _own_model(root / "run_model", "none", data, ["w", "x", "y", "z"])
    config = root / "study.yaml"
    config.write_text(f"models: [{run_model}]\ndata: ['{data}']\neval_images: 8\nprobe:\n  images: 8\n"
                      "head:\n  images: 8\nextrapolate:\n  images: 8\n  scales: [1.5]\n")
    run_out = root / "run_out"
    _main(["run", "--config", str(config), "--out", str(run_out), "--no-progress"])
    assert (run_out / "results.json").is_file()
    train_out = root / "train_out"
    train("none", train_out, epochs=2, quick=True, progress=False, model_overrides={"depth": 1})
    state = json.loads((train_out / "checkpoint" / "state.json").read_text())
    state.update(epochs_done=1, history=state["history"][:1])  # as if killed after epoch 1
    write_json(train_out / "checkpoint" / "state.json", state)
    for name in ("metrics.json", "model.safetensors", "config.json"):
        (train_out / name).unlink()
    store = root / "store"
    _main(["capture", "-m", str(model), "--data", data, "--split", "train", "--limit", "8", "--shard-images", "4",
           "--sites", "blocks.1.resid_post", "--out", str(store), "--no-progress"])
    return World(root, data, model, ape, root / "head", sae_dir, config, run_out, train_out, store)


# --- running a command and checking the contract ---------------------------------------------------

def _main(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _snapshot(out: Path | None) -> dict[str, str] | None:
    if out is None or not out.exists():
        return None
    if out.is_file():
        return {"": hashlib.sha256(out.read_bytes()).hexdigest()}
    return {str(p.relative_to(out)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(out.rglob("*")) if p.name != ".vitpos.lock"}


def _numbers(doc) -> list[float]:
    if isinstance(doc, dict):
        return [v for x in doc.values() for v in _numbers(x)]
    if isinstance(doc, list):
        return [v for x in doc for v in _numbers(x)]
    return [float(doc)] if isinstance(doc, int | float) and not isinstance(doc, bool) else []


LAST_ERR = [""]  # the stderr of the latest check_contract


def check_contract(argv: list[str], out: Path | None, capsys, sane: Callable[[], None] | None = None) -> int:
    capsys.readouterr()
    before = _snapshot(out)
    code = _main(argv)
    cap = capsys.readouterr()
    LAST_ERR[0] = cap.err
    where = (" ".join(argv), cap.err[-1500:])
    assert "Traceback" not in cap.err, where
    if code == 0:
        if sane is not None:
            sane()
        return code
    assert code == 2, where
    err = [line for line in cap.err.splitlines() if line.strip()]
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and err[-1] == errors[0], where
    assert _snapshot(out) == before, where  # nothing left behind, nothing removed
    return code


def _top1_sane(path: Path) -> Callable[[], None]:
    def check() -> None:
        doc = json.loads(path.read_text())
        top1 = [v for k, v in doc.items() if k.endswith("top1")]
        assert top1 and all(0.0 <= v <= 1.0 for v in top1), doc

    return check


def _finite_json(path: Path) -> Callable[[], None]:
    def check() -> None:
        assert path.is_file(), path
        doc = json.loads(path.read_text())
        assert _numbers(doc), path
    return check


# --- the mutations ---------------------------------------------------------------------------------

def _json_mutations(raw: bytes) -> dict[str, bytes]:
    doc = json.loads(raw)
    out = {"truncate": raw[: len(raw) // 2], "empty": b"", "non_utf8": b"\xff\xfe" + raw, "list": b"[1, 2]",
           "string": b'"text"', "null": b"null", "deep": b"[" * 100_000}
    if isinstance(doc, dict) and doc:
        keys = sorted(doc)
        rng = random.Random(f"{SEED}{raw[:64]!r}")
        k = rng.choice(keys)
        out[f"missing_key:{k}"] = json.dumps({x: v for x, v in doc.items() if x != k}).encode()
        out[f"wrong_type:{k}"] = json.dumps({**doc, k: [{"x": None}]}).encode()
        nums = [x for x in keys if isinstance(doc[x], int | float) and not isinstance(doc[x], bool)]
        if nums:
            for how, value in (("nan", float("nan")), ("huge", 10**30), ("negative", -7)):
                k = rng.choice(nums)
                out[f"{how}:{k}"] = json.dumps({**doc, k: value}).encode()  # NaN: the literal NaN
    return out


def _safetensors_mutations(path: Path) -> dict[str, bytes]:
    from safetensors import safe_open

    raw = path.read_bytes()
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    floats = sorted(k for k, t in tensors.items() if t.is_floating_point() and t.numel())

    def encode(ts: dict[str, torch.Tensor], md: dict[str, str] | None = None) -> bytes:
        tmp = path.with_suffix(".mut")
        save_file(ts, str(tmp), metadata=meta if md is None else md)
        data = tmp.read_bytes()
        tmp.unlink()
        return data

    out = {"truncate": raw[: len(raw) // 2], "empty": b"", "non_utf8": b"\xff\xfe" + raw[2:],
           "wrong_shape": encode({**tensors, name: torch.zeros(3)}),
           "missing_tensor": encode({k: v for k, v in tensors.items() if k != name}),
           "wrong_dtype": encode({**tensors, name: tensors[name].to(torch.int64)})}
    if floats:
        out["nan"] = encode({**tensors, floats[-1]: torch.full_like(tensors[floats[-1]], float("nan"))})
        out["inf"] = encode({**tensors, floats[0]: torch.full_like(tensors[floats[0]], float("inf"))})
    if "weights" in meta:
        out["other_model"] = encode(tensors, {**meta, "weights": "0123456789abcdef"})
    return out


def _yaml_mutations(raw: bytes) -> dict[str, bytes]:
    return {"truncate": raw[: len(raw) // 2], "non_utf8": b"\xff\xfe" + raw, "list": b"- 1\n- 2\n",
            "null_section": raw + b"rope_axis:\n", "list_section": raw + b"rope_axis: [1, 2]\n",
            "models_empty": b"models: []\n", "nan": raw + b"sae:\n  lr: .nan\n", "inf": raw + b"seed: .inf\n",
            "huge_seed": raw + b"seed: 18446744073709551616\n", "k_over_dictionary": raw + b"sae:\n  k: 100000\n",
            "small_scale": raw.replace(b"scales: [1.5]", b"scales: [0.5]"),
            "huge_scale": raw.replace(b"scales: [1.5]", b"scales: [1.0e+300]"),
            "wrong_type": raw + b"probe: 7\n", "empty": b""}


def _image_mutations(path: Path, tmp: Path) -> dict[str, bytes]:
    raw = path.read_bytes()
    bomb = tmp / "bomb.png"
    Image.new("1", (9000, 9000)).save(bomb)  # 81 M pixels in a few kB
    return {"truncate": raw[: len(raw) // 2], "empty": b"", "not_an_image": b"\xff\xfe not a png",
            "bomb": bomb.read_bytes()}


@dataclass(frozen=True)
class FileKind:
    """A file vitpos reads, the command that reads it, and the out folder the contract watches."""

    name: str
    file: Callable[[World], Path]  # the file in a world (copied before it is mutated)
    copy_root: Callable[[World], Path]  # the folder copied per case (holds the file)
    argv: Callable[[World, Path, Path], list[str]]  # (world, the copied folder, out) -> argv
    out_in_copy: bool = False  # --out is the copied folder itself (a resume)
    sane: Callable[[Path], Callable[[], None]] | None = None


def _eval_sane(out: Path) -> Callable[[], None]:
    return _top1_sane(out / "eval.json")


FILE_KINDS = [
    FileKind("run_config", lambda w: w.config, lambda w: w.config,
             lambda w, c, o: ["run", "--plan", "--config", str(c), "--out", str(o)]),
    FileKind("head_json", lambda w: w.head / "head.json", lambda w: w.head,
             lambda w, c, o: ["eval", "-m", str(w.model), "--data", w.data, "--head", str(c), "--limit", "4",
                              "--out", str(o), "--no-progress"], sane=_eval_sane),
    FileKind("head_weights", lambda w: w.head / "head.safetensors", lambda w: w.head,
             lambda w, c, o: ["eval", "-m", str(w.model), "--data", w.data, "--head", str(c), "--limit", "4",
                              "--out", str(o), "--no-progress"], sane=_eval_sane),
    FileKind("model_config", lambda w: w.model / "config.json", lambda w: w.model,
             lambda w, c, o: ["eval", "-m", str(c), "--data", w.data, "--limit", "4", "--out", str(o),
                              "--no-progress"], sane=_eval_sane),
    FileKind("model_weights", lambda w: w.model / "model.safetensors", lambda w: w.model,
             lambda w, c, o: ["eval", "-m", str(c), "--data", w.data, "--limit", "4", "--out", str(o),
                              "--no-progress"], sane=_eval_sane),
    FileKind("sae_json", lambda w: w.sae / "sae.json", lambda w: w.sae,
             lambda w, c, o: ["intervene", "ape-permute", "-m", str(w.ape), "--data", w.data, "--sae", str(c),
                              "--images", "4", "--seeds", "1", "--out", str(o), "--no-progress"]),
    FileKind("sae_weights", lambda w: w.sae / "sae.safetensors", lambda w: w.sae,
             lambda w, c, o: ["intervene", "ape-permute", "-m", str(w.ape), "--data", w.data, "--sae", str(c),
                              "--images", "4", "--seeds", "1", "--out", str(o), "--no-progress"]),
    FileKind("stage_cache", lambda w: next((w.run_out / "stages").glob("*/eval-*.json")), lambda w: w.run_out,
             lambda w, c, o: ["run", "--config", str(w.config), "--out", str(c), "--no-progress"], out_in_copy=True,
             sane=lambda o: _finite_json(o / "results.json")),
    FileKind("results", lambda w: w.run_out / "results.json", lambda w: w.run_out, lambda w, c, o: []),
    FileKind("train_state", lambda w: w.train_out / "checkpoint" / "state.json", lambda w: w.train_out,
             lambda w, c, o: ["train", "--pe", "none", "--quick", "--epochs", "2", "--out", str(c),
                              "--no-progress"], out_in_copy=True, sane=lambda o: _finite_json(o / "metrics.json")),
    FileKind("train_optimiser", lambda w: w.train_out / "checkpoint" / "optim.safetensors", lambda w: w.train_out,
             lambda w, c, o: ["train", "--pe", "none", "--quick", "--epochs", "2", "--out", str(c),
                              "--no-progress"], out_in_copy=True, sane=lambda o: _finite_json(o / "metrics.json")),
    FileKind("train_checkpoint", lambda w: w.train_out / "checkpoint" / "model.safetensors", lambda w: w.train_out,
             lambda w, c, o: ["train", "--pe", "none", "--quick", "--epochs", "2", "--out", str(c),
                              "--no-progress"], out_in_copy=True, sane=lambda o: _finite_json(o / "metrics.json")),
    FileKind("store_manifest", lambda w: w.store / "manifest.json", lambda w: w.store,
             lambda w, c, o: ["sae", "-m", str(w.model), "--layer", "1", "--data", w.data, "--store", str(c),
                              "--batch-tokens", "32", "--eval-images", "4", "--epochs", "1", "--expansion", "1",
                              "--k", "2", "--out", str(o), "--no-progress"]),
    FileKind("store_shard", lambda w: next(w.store.glob("shard-*.safetensors")), lambda w: w.store,
             lambda w, c, o: ["sae", "-m", str(w.model), "--layer", "1", "--data", w.data, "--store", str(c),
                              "--batch-tokens", "32", "--eval-images", "4", "--epochs", "1", "--expansion", "1",
                              "--k", "2", "--out", str(o), "--no-progress"]),
    FileKind("image", lambda w: Path(w.data[len("imagefolder:"):]) / "test" / "a" / "0.png",
             lambda w: Path(w.data[len("imagefolder:"):]),
             lambda w, c, o: ["probe", "-m", str(w.model), "--data", f"imagefolder:{c}", "--images", "16",
                              "--out", str(o), "--no-progress"]),
]


def _mutations(kind: FileKind, w: World, tmp: Path) -> dict[str, bytes]:
    path = kind.file(w)
    if path.suffix == ".safetensors":
        return _safetensors_mutations(path)
    if path.suffix == ".yaml":
        return _yaml_mutations(path.read_bytes())
    if path.suffix == ".png":
        return _image_mutations(path, tmp)
    found = _json_mutations(path.read_bytes())
    if kind.name == "stage_cache":  # each case reruns a (tiny) study: a seeded sample of the mutations
        keep = ["non_utf8", "list", *random.Random(SEED).sample(sorted(set(found) - {"non_utf8", "list"}), 2)]
        found = {k: found[k] for k in keep}
    return found


def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return dst


@pytest.mark.parametrize("kind", FILE_KINDS, ids=[k.name for k in FILE_KINDS])
def test_every_mutated_file_is_resumed_or_refused_in_one_line(kind, world, tmp_path, capsys):
    from vitpos.errors import VitposError
    from vitpos.study.results import load_results

    outcomes = {}
    for i, (how, raw) in enumerate(sorted(_mutations(kind, world, tmp_path).items())):
        src_root = kind.copy_root(world)
        copy = _copy(src_root, tmp_path / f"case{i}" / src_root.name)
        target = copy / kind.file(world).relative_to(src_root) if src_root.is_dir() else copy
        target.write_bytes(raw)
        if kind.name == "results":  # no command reads results.json: its typed loader does
            try:
                res = load_results(copy)
                outcomes[how] = 0
                assert all(math.isfinite(v) or math.isnan(v) for v in _numbers(res.to_json()))
            except VitposError as e:
                assert "\n" not in str(e) and str(target) in str(e), (how, str(e))
                outcomes[how] = 2
            continue
        out = copy if kind.out_in_copy else tmp_path / f"case{i}" / "out"
        argv = kind.argv(world, copy, out)
        outcomes[how] = check_contract(argv, out, capsys, kind.sane(out) if kind.sane else None)
        if kind.name == "stage_cache":  # recomputed, and said so
            said = " ".join(LAST_ERR[0].split())  # once, with one instruction: the run recomputes it
            assert said.count("damaged stage-cache entry") == 1 and "recomputing it" in said, (how, said[-800:])
            assert "delete it" not in said, (how, said[-800:])
    # a file that no longer decodes is never silently accepted
    for how in ("truncate", "non_utf8", "empty"):
        if how in outcomes and kind.name != "stage_cache" and (how, kind.name) != ("truncate", "run_config"):
            assert outcomes[how] == 2, (kind.name, how, outcomes)
    if kind.name == "stage_cache":  # a damaged cache entry is recomputed (and said so), never an error
        assert set(outcomes.values()) == {0}, outcomes
    if kind.name in ("head_weights", "sae_weights", "model_weights", "train_checkpoint"):
        assert outcomes.get("nan") == 2 and outcomes.get("wrong_shape") == 2, outcomes
    if kind.name in ("head_weights", "sae_weights"):
        assert outcomes.get("other_model") == 2, outcomes


# --- numeric options --------------------------------------------------------------------------------

NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e308", str(2**64), ""]


def _options(w: World) -> list[tuple[str, list[str], str]]:
    """(command argv with {} where the value goes, the option) for every numeric option."""
    m, a, d = str(w.model), str(w.ape), w.data
    eval_ = ["eval", "-m", m, "--data", d, "--limit", "4", "--no-progress"]
    probe = ["probe", "-m", m, "--data", d, "--images", "8", "--no-progress"]
    sae = ["sae", "-m", m, "--layer", "1", "--data", d, "--store", str(w.store), "--batch-tokens", "32",
           "--eval-images", "4", "--epochs", "1", "--expansion", "1", "--k", "2", "--no-progress"]
    permute = ["intervene", "ape-permute", "-m", a, "--data", d, "--sae", str(w.sae), "--images", "4", "--seeds", "1",
               "--no-progress"]
    extra = ["extrapolate", "-m", m, "--data", d, "--images", "8", "--scales", "1.5", "--no-progress"]
    head = ["head", "-m", m, "--data", d, "--images", "8", "--no-progress"]
    capture = ["capture", "-m", m, "--data", d, "--split", "test", "--limit", "4", "--no-progress"]
    train = ["train", "--pe", "none", "--quick", "--epochs", "1", "--no-progress"]
    run = ["run", "--plan", "--config", str(w.config)]
    cases = []
    for base, opts in ((eval_, ["--limit"]), (probe, ["--images", "--seed"]),
                       (sae, ["--k", "--expansion", "--epochs", "--eval-images", "--batch-tokens", "--buffer-tokens",
                              "--lr", "--checkpoint-every", "--seed", "--layer"]),
                       (permute, ["--images", "--seeds"]), (extra, ["--images", "--scales", "--seed"]),
                       (head, ["--images", "--seed"]), (capture, ["--limit", "--batch-size", "--shard-images"]),
                       (train, ["--lr", "--epochs", "--batch-size", "--seed"]),
                       (run, ["--seed", "--model-seeds"])):
        for opt in opts:
            cases.append((base[0] if base[0] != "intervene" else base[1], base, opt))
    return cases


def test_every_numeric_option_at_its_edges(world, tmp_path, capsys):
    rng = random.Random(SEED)
    n = 0
    for cmd, base, opt in _options(world):
        # every option meets every edge value that fails fast; values that a command may accept (and
        # then run on) are sampled, to keep the module within its time budget
        for value in NUMBERS:
            if value in ("1e308", str(2**64)) and opt not in ("--lr", "--scales", "--seed", "--k", "--expansion",
                                                               "--epochs", "--seeds", "--model-seeds", "--layer"):
                if rng.random() > 0.25:
                    continue
            n += 1
            out = tmp_path / f"n{n}" / "out"
            args = list(base)
            if opt in args:  # replace the base value
                args[args.index(opt) + 1] = value
            else:
                args += [opt, value]
            args += ["--out", str(out)]
            sane = _top1_sane(out / "eval.json") if cmd == "eval" else None
            check_contract(args, out, capsys, sane)
    assert n >= 100


def test_diverging_training_stops_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    code = check_contract(["train", "--pe", "ape", "--quick", "--epochs", "1", "--lr", "1e308", "--out", str(out),
                           "--no-progress"], out, capsys)
    assert code == 2 and not out.exists()


@pytest.mark.parametrize("point", ["write:train_config.json", "write:model.safetensors", "write:state.json",
                                   "write:metrics.json"])
def test_a_full_disk_during_train_leaves_nothing(point, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VITPOS_FAULT", f"enospc:{point}")
    out = tmp_path / "out"
    code = check_contract(["train", "--pe", "none", "--quick", "--epochs", "1", "--out", str(out), "--no-progress"],
                          out, capsys)
    assert code == 2 and not out.exists()


def test_a_full_disk_during_capture_leaves_the_folder_as_it_was(world, tmp_path, capsys, monkeypatch):
    out = tmp_path / "store"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    monkeypatch.setenv("VITPOS_FAULT", "enospc:write:manifest.json@2")
    code = check_contract(["capture", "-m", str(world.model), "--data", world.data, "--split", "test", "--limit", "4",
                           "--shard-images", "2", "--out", str(out), "--no-progress"], out, capsys)
    assert code == 2 and sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_empty_means_error(world, tmp_path, capsys):
    for argv in (["run", "--plan", "--models", "", "--out", str(tmp_path / "o")],
                 ["run", "--plan", "--data", "", "--out", str(tmp_path / "o")],
                 ["run", "--plan", "--models", f"{world.model},", "--out", str(tmp_path / "o")],
                 ["eval", "-m", str(world.model), "--data", world.data, "--limit", "2", "--out", ""]):
        assert check_contract(argv, tmp_path / "o", capsys) == 2, argv


def test_timm_spec_queries_are_bounded_and_never_unpickle(tmp_path, capsys):
    base = "timm:vit_small_patch16_224?img_size=16&depth=1&embed_dim=32&num_heads=2&num_classes=4"
    for q in ("&patch_size=0", "&num_classes=nan", "&img_size=1e308", "&embed_dim=-1", "&depth=99999999",
              f"&checkpoint_path={tmp_path}/evil.pth", "&pretrained_cfg_overlay=x", "&patch_size=4.5"):
        out = tmp_path / "out"
        assert check_contract(["eval", "-m", base.replace("&depth=1", "&depth=1&patch_size=4") + q
                               if "patch_size" not in q else base + q, "--limit", "2", "--data", "shapes",
                               "--out", str(out)], out, capsys) == 2, q


def test_a_copied_run_reads_its_own_artifacts(world, tmp_path):
    """Artifact paths in results are relative to the output folder."""
    from vitpos.study.results import load_results

    copy = _copy(world.run_out, tmp_path / "copy")
    res = load_results(copy)
    assert str(world.run_out) not in (copy / "results.json").read_text()
    (entry,) = res.models.values()
    assert entry.head is not None and entry.head.source == "fitted" and not Path(entry.head.head_dir).is_absolute()
    shutil.rmtree(world.run_out / entry.head.head_dir, ignore_errors=False)  # the original's head is gone...
    try:  # ...and the copy's rerun still finds every stage cached, its own head included
        lines: list[str] = []
        from vitpos.study.config import load_config
        from vitpos.study.run import run_study

        run_study(copy, load_config(world.config, {}, False), progress=False, log=lines.append, measure=None)
        assert any("head: cached" in line for line in lines) and not any(" ..." in line for line in lines), lines
    finally:
        shutil.rmtree(world.run_out)
        shutil.copytree(copy, world.run_out)


def test_own_model_trained_on_other_classes_is_refused(world, tmp_path, capsys):
    """The tiny model records the image folder's classes: shapes (other classes) is refused for top-1."""
    out = tmp_path / "out"
    assert check_contract(["eval", "-m", str(world.model), "--data", "shapes", "--limit", "4", "--out", str(out)],
                          out, capsys) == 2


def test_a_head_whose_class_count_disagrees_with_its_names_is_refused(world, tmp_path, capsys):
    head = _copy(world.head, tmp_path / "head")
    doc = json.loads((head / "head.json").read_text())
    doc["classes"] = doc["classes"][:3]  # 3 names, num_classes 4, weights of 4 rows
    (head / "head.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert check_contract(["eval", "-m", str(world.model), "--data", world.data, "--head", str(head), "--limit", "4",
                           "--out", str(out)], out, capsys) == 2
    assert "num_classes is 4 but classes names 3" in LAST_ERR[0]


# --- the surfaces of issue 49: HF folders, sae.json for browse, stage-cache entries, run configs --------
# Their own small world (no `vitpos run` in it): each case is one model load and a few images.

@dataclass
class Small:
    hf: Path  # a save_pretrained folder of a toy DINOv2 classifier (config.json, preprocessor_config.json, weights)
    ape: Path  # an own APE model (32 px, 8-px patches) trained on nothing, for the SAE
    sae: Path  # an SAE of `ape`, as `vitpos sae` leaves it (sae.json + sae.safetensors)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Small:
    from vitpos.models import load_model
    from vitpos.models.hf_families import tiny_spec
    from vitpos.sae import SAE, SAEConfig

    root = tmp_path_factory.mktemp("small")
    torch.manual_seed(0)
    classifier = "hf:Dinov2ForImageClassification?" + tiny_spec("dinov2").split("?")[1] + "&num_labels=4"
    load_model(classifier).model.save_pretrained(root / "hf")  # 4 logits: eval on shapes is one forward
    write_json(root / "hf" / "preprocessor_config.json", {"image_mean": [0.485, 0.456, 0.406],
                                                           "image_std": [0.229, 0.224, 0.225], "resample": 3})
    ape = _own_model(root / "ape", "ape", "shapes")
    digest = load_model(str(ape)).weights_digest()
    sae = root / "sae"
    SAE(SAEConfig(d_in=32, expansion=2, k=4)).save(sae, model_weights=digest)
    write_json(sae / "sae.json", {"model": str(ape), "layer": 1, "site": "resid_post", "data": "shapes", "tokens": 64,
                                  "row_features": [0, 1], "col_features": [2], "mixed_features": [], "fvu": 0.5,
                                  "dead_frac": 0.1, "top1": None, "run": {"weights": digest}})
    return Small(root / "hf", ape, sae)


def _more_json_mutations(raw: bytes, keys: dict[str, object]) -> dict[str, bytes]:
    """_json_mutations plus: NaN / infinity / a huge number / another type in named keys, an extra key."""
    doc = json.loads(raw)
    out = _json_mutations(raw)
    out["extra_key"] = json.dumps({**doc, "vitpos_extra": 1}).encode()
    for k, bad in keys.items():
        for how, value in (("nan", float("nan")), ("inf", float("inf")), ("huge", 10**30), ("bad", bad)):
            out[f"{how}:{k}"] = json.dumps({**doc, k: value}).encode()
    return out


@dataclass(frozen=True)
class NewKind:
    name: str
    file: Callable[[Small], Path]
    mutations: Callable[[bytes], dict[str, bytes]]
    argv: Callable[[Small, Path, Path], list[str]]  # (small, the copied folder, out) -> argv


NEW_KINDS = [
    NewKind("hf_config", lambda s: s.hf / "config.json",
            lambda raw: _more_json_mutations(raw, {"num_hidden_layers": 0, "hidden_size": "wide", "patch_size": -4,
                                                   "image_size": [16, 16, 16]}),
            lambda s, c, o: ["eval", "-m", f"hf:{c}", "--data", "shapes", "--limit", "4", "--out", str(o),
                             "--no-progress"]),
    NewKind("hf_preprocessor", lambda s: s.hf / "preprocessor_config.json",
            lambda raw: _more_json_mutations(raw, {"image_mean": "abc", "image_std": [0.5, 0.0, 0.5],
                                                   "resample": "cubic"}),
            lambda s, c, o: ["eval", "-m", f"hf:{c}", "--data", "shapes", "--limit", "4", "--out", str(o),
                             "--no-progress"]),
    NewKind("browse_sae_json", lambda s: s.sae / "sae.json",
            lambda raw: _more_json_mutations(raw, {"tokens": "many", "data": 7, "layer": 99, "model": None,
                                                   "top1": 7.5, "run": {"weights": "0123456789abcdef"}}),
            lambda s, c, o: ["browse", str(c), "--images", "4", "--top-k", "2", "--out", str(o)]),
]


@pytest.mark.parametrize("kind", NEW_KINDS, ids=[k.name for k in NEW_KINDS])
def test_every_mutated_new_file_is_refused_in_one_line(kind, small, tmp_path, capsys):
    path = kind.file(small)
    root = path.parent
    outcomes = {}
    for i, (how, raw) in enumerate(sorted(kind.mutations(path.read_bytes()).items())):
        copy = _copy(root, tmp_path / f"case{i}" / root.name)
        (copy / path.name).write_bytes(raw)
        out = tmp_path / f"case{i}" / "out"
        outcomes[how] = check_contract(kind.argv(small, copy, out), out, capsys)
        if outcomes[how] == 2:
            assert path.name in LAST_ERR[0] or "hf:" in LAST_ERR[0], (how, LAST_ERR[0][-600:])
    for how in ("truncate", "non_utf8", "empty", "list", "null"):  # a file that no longer decodes is refused
        assert outcomes[how] == 2, (kind.name, how, outcomes)
    assert outcomes["extra_key"] == 0, outcomes  # an unknown key of a file vitpos reads only parts of is kept
    if kind.name != "hf_config":  # transformers reads its own config: a NaN there is its matter (and refused later)
        assert all(code == 2 for how, code in outcomes.items() if how.split(":")[0] in ("nan", "inf", "bad")), outcomes


def _cache_entries() -> dict[str, dict]:
    """One stage-cache result of each shape the study caches: eval, a head, a probe site, the validation table."""
    from vitpos.claims.registry import rule_set

    rules = rule_set()

    return {
        "eval": {"top1": 0.5, "n": 8, "per_class": {"a": 0.5, "b": 0.5}, "per_group": {}, "top1_ci95": [0.2, 0.8]},
        "head": {"head_dir": "artifacts/m/head", "source": "fitted", "reason": "r", "val_top1": 0.5, "test_top1": 0.25,
                 "l2": 1.0, "val_top1_by_l2": [0.5, 0.25], "n_train_images": 8},
        "probe": {"layers": [0, 1], "row_acc": [0.5, 0.75], "col_acc": [0.25, 1.0], "row_control_acc": [0.3, None],
                  "dead_frac": 0.0, "rebuild_score": [[0.1, float("nan")]]},
        "validation": {"rules_version": rules.version, "rules_hash": rules.digest(), "n_images": 8, "seeds": [0],
                       "rows": [{"claim": "C1", "case": "c", "description": "d", "planted": True,
                                 "verdict": "supported", "expected": "supported", "passes": True, "evidence": "e"}]},
    }


def _leaves(doc, path=()) -> list[tuple]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in _leaves(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _leaves(v, (*path, i))]
    return [path] if isinstance(doc, int | float) and not isinstance(doc, bool) else []


def _set(doc, path: tuple, value):
    import copy as _copy_mod

    out = _copy_mod.deepcopy(doc)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


# what each numeric key of _cache_entries() is: its physical bounds, independent of how sanity.py finds them
FRACTIONS = {"top1", "per_class", "top1_ci95", "val_top1", "test_top1", "val_top1_by_l2", "row_acc", "col_acc",
             "row_control_acc", "dead_frac"}
COUNTS = {"n", "n_train_images", "n_images"}
NAN_IS_A_MEASUREMENT = {"rebuild_score"}
FREE = {"l2", "layers", "seeds", "rules_version"}  # rules_version: any other than this vitpos's is refused


def test_every_impossible_stage_cache_number_is_a_damaged_entry(tmp_path):
    """Every numeric leaf of each cached result, set to NaN / infinity / 7.5 / -7: an entry whose value
    cannot be right is damaged (get() gives None: the stage recomputes, said once); one that can
    (a count of 7, a NaN where NaN is a measurement) is served as it is. The entry's bytes mutated
    are never served as another result."""
    from vitpos.study.cache import StageCache
    from vitpos.study.sanity import validation_problem

    said: list[str] = []
    cache = StageCache(tmp_path, force=False, log=said.append)
    n = 0
    for stage, result in _cache_entries().items():
        check = validation_problem if stage == "validation" else None
        path = tmp_path / f"{stage}.json"
        cache.put(path, {}, result, 1.0)
        assert cache.get(path, check) == json.loads(path.read_text())["result"], stage  # the valid one is served
        for leaf in _leaves(result):
            name = str(leaf[-2]) if len(leaf) > 1 and leaf[-2] == "per_class" else next(
                str(p) for p in reversed(leaf) if isinstance(p, str))
            assert name in FRACTIONS | COUNTS | NAN_IS_A_MEASUREMENT | FREE, name  # the table covers every key
            for value in (float("nan"), float("inf"), 7.5, -7):
                n += 1
                entry = tmp_path / f"{stage}-{n}.json"
                cache.put(entry, {}, _set(result, leaf, value), 1.0)  # as if the stage had computed it
                impossible = (math.isinf(value) or name == "rules_version"
                              or (math.isnan(value) and name not in NAN_IS_A_MEASUREMENT)
                              or (name in FRACTIONS and not math.isnan(value)) or name in COUNTS)
                assert (cache.get(entry, check) is None) == impossible, (stage, leaf, value, said[-1:])
                if impossible:
                    assert said[-1].startswith("warning: damaged stage-cache entry") and "recomputing it" in said[-1]
    assert n > 60
    good = {"key": {}, "seconds": 1.0, "result": {"top1": 0.5}}
    for how, raw in _json_mutations(json.dumps(good).encode()).items():
        entry = tmp_path / f"bytes-{how.replace(':', '_')}.json"
        entry.write_bytes(raw)
        assert cache.get(entry) in (None, good["result"]), how


def _config_mutations(suffix: str) -> dict[str, bytes]:
    if suffix == ".toml":
        base = b'seed = 1\n[probe]\nimages = 16\n'
        bad = {"nan": base.replace(b"16", b"nan"), "inf": base.replace(b"seed = 1", b"seed = inf"),
               "huge": base.replace(b"seed = 1", b"seed = 18446744073709551616"),
               "wrong_type": base.replace(b"images = 16", b'images = "many"'), "duplicate_key": base + b"seed = 2\n",
               "extra_key": b"bogus = 1\n" + base, "list": b"seed = [1, 2]\n"}
    else:
        base = b"seed: 1\nprobe:\n  images: 16\n"
        bad = {"nan": base.replace(b"16", b".nan"), "inf": base.replace(b"seed: 1", b"seed: .inf"),
               "huge": base.replace(b"seed: 1", b"seed: 18446744073709551616"),
               "wrong_type": base.replace(b"images: 16", b"images: many"), "duplicate_key": base + b"seed: 2\n",
               "extra_key": b"bogus: 1\n" + base, "list": b"- 1\n- 2\n"}
    # truncate: cut inside the last value (a cut at a line end can leave a shorter valid file)
    return {**bad, "truncate": base[: len(base) - 4], "non_utf8": b"\xff\xfe" + base, "empty": b"",
            "valid": base, "bom": b"\xef\xbb\xbf" + base}


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_every_mutated_run_config_is_refused_in_one_line(suffix, tmp_path, capsys):
    """Each mutation through `run --plan` (one error line, --out unchanged); a config that loads (the
    valid one, with a byte-order mark too) is read by load_config only: its plan would time the model."""
    from vitpos.errors import VitposError
    from vitpos.study.config import load_config

    outcomes = {}
    for how, raw in sorted(_config_mutations(suffix).items()):
        config = tmp_path / f"{how}{suffix}"
        config.write_bytes(raw)
        try:
            load_config(config, {}, quick=True)
            outcomes[how] = 0
            continue
        except VitposError:
            pass
        out = tmp_path / how / "out"
        out.mkdir(parents=True)
        outcomes[how] = check_contract(["run", "--plan", "--quick", "--models", "builtin:ape", "--config", str(config),
                                        "--out", str(out)], out, capsys)
        assert "config" in LAST_ERR[0], (how, LAST_ERR[0])
    assert outcomes["valid"] == outcomes["bom"] == 0, outcomes  # a byte-order mark is read past
    assert all(code == 2 for how, code in outcomes.items() if how not in ("valid", "bom")), outcomes
