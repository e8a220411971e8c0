"""Every bad input ends as exactly one `error:` line on stderr, exit code 2, no traceback, nothing on
stdout — table-driven over the CLI (in process: `vitpos.cli.main(argv)`)."""

from __future__ import annotations

import pytest

from vitpos.cli import main
from vitpos.io import write_json
from vitpos.sae import SAE, SAEConfig


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    (root / "a_file").write_text("not a directory")
    (root / "garbage.safetensors").write_bytes(b"\x00garbage" * 10)
    (root / "evil.pt").write_bytes(b"not read")
    (root / "missing_probe.yaml").write_text("probe:\n  images: -5\n")
    (root / "unknown.yaml").write_text("probe:\n  imgs: 3\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "broken.yaml").write_text("probe: [unclosed\n")
    (root / "k0.yaml").write_text("sae:\n  k: 0\n")
    (root / "restore.yaml").write_text("rope_axis:\n  restore: []\n")
    (root / "lr.toml").write_text("[sae]\nlr = -1.0\n")
    (root / "scales.yaml").write_text("extrapolate:\n  scales: [0]\n")
    (root / "empty_folder").mkdir()
    (root / "k_big.yaml").write_text("sae:\n  k: 100000\n")
    (root / "half.yaml").write_text("extrapolate:\n  scales: [0.5]\n")
    (root / "axis_null.yaml").write_text("rope_axis:\n")
    (root / "axis_list.yaml").write_text("rope_axis: [1, 2]\n")
    (root / "no_models.yaml").write_text("models: []\n")
    (root / "empty.yaml").write_text("")
    (root / "own_cfg").mkdir()  # a `vitpos train` folder's config.json: no model_type for transformers
    (root / "own_cfg" / "config.json").write_text('{"model": {"family": "vitpos-own", "pe": "ape"}}')
    (root / "latin1.yaml").write_bytes("seed: 1 # caf\xe9\n".encode("latin-1"))
    from PIL import Image  # one class in every split: a top-1 of 100 % that measures nothing

    for split in ("train", "val", "test"):
        (root / "one_class" / split / "a").mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (32, 32), (40 * i, 0, 0)).save(root / "one_class" / split / "a" / f"{i}.png")
    sae_dir = root / "sae_ape"  # an SAE trained on builtin:ape (96-wide), as `vitpos sae` leaves it
    SAE(SAEConfig(d_in=96, expansion=2, k=4)).save(sae_dir)
    write_json(sae_dir / "sae.json", {"model": "builtin:ape", "layer": 1, "site": "resid_post", "row_features": [0],
                                      "col_features": [1], "mixed_features": [], "run": {"weights": "0" * 16}})
    return root


CASES = [  # {root}: the fixture folder; {out}: a fresh output folder per case
    # train
    "train --pe bogus --out {out}",
    "train --pe ape",
    "train --pe ape --out {out} --lr inf",
    "train --pe ape --out {out} --lr -1",
    "train --pe ape --out {out} --lr 0",
    "train --pe ape --out {out} --lr nan",
    "train --pe ape --out {out} --batch-size 0",
    "train --pe ape --out {out} --epochs 0",
    "train --pe ape --out {out} --epochs abc",
    "train --pe ape --out {out} --data nope",
    "train --pe ape --out {root}/a_file --quick",
    # eval and model specs
    "eval",
    "eval -m builtin:nope",
    "eval -m builtin:ape --limit 0",
    "eval -m builtin:ape --split bogus",
    "eval -m builtin:ape --checkpoint {root}/evil.pt",
    "eval -m builtin:ape --pretrained",
    "eval -m timm:vit_small_patch16_224?img_size=-32",
    "eval -m timm:no_such_model_xyz",
    "eval -m timm:vit_small_patch16_224?bogus=1",
    "eval -m timm:vit_small_patch16_224?img_size=32 --checkpoint {root}/evil.pt",
    "eval -m timm:vit_small_patch16_224?img_size=32 --checkpoint {root}/missing.safetensors",
    "eval -m timm:vit_small_patch16_224?img_size=32 --checkpoint {root}/garbage.safetensors",
    "eval -m {root}/no_such_dir",
    "eval -m hf:{root}/own_cfg",
    "eval -m builtin:ape --data imagefolder:{root}/no_such_dir",
    "eval -m builtin:ape --data imagefolder:",
    "eval -m builtin:ape --data imagefolder:{root}/empty_folder",
    "eval -m builtin:ape --data nope",
    "eval -m builtin:fashion-ape --data shapes --limit 8",
    "eval -m builtin:ape --bogus-flag",
    "frobnicate",
    # capture
    "capture -m builtin:ape --out {out} --limit 0",
    "capture -m builtin:ape --out {out} --batch-size 0",
    "capture -m builtin:ape --out {out} --shard-images 0",
    "capture -m builtin:ape --out {out} --dtype int8",
    "capture -m builtin:ape --out {out} --sites bogus --limit 4",
    "capture -m builtin:ape --out {out} --split nope",
    "capture -m builtin:ape --out {out} --amp fp16 --limit 4",
    # probe
    "probe -m builtin:ape --out {out} --images 0",
    "probe -m builtin:ape --out {out} --images 1",
    "probe -m builtin:ape --out {out} --sites bogus --images 8",
    "probe -m builtin:ape --out {out} --device cuda --images 8",
    "probe -m builtin:ape --out {out} --amp bogus",
    # sae
    "sae -m builtin:ape --layer 1 --out {out} --k 0",
    "sae -m builtin:ape --layer 1 --out {out} --expansion 0",
    "sae -m builtin:ape --layer 1 --out {out} --arch gated",
    "sae -m builtin:ape --layer 99 --out {out} --images 64",
    "sae -m builtin:ape --layer -1 --out {out}",
    "sae -m builtin:ape --layer 1 --out {out} --site q",
    "sae -m builtin:ape --layer 1 --out {out} --images 20",
    "sae -m builtin:ape --layer 1 --out {out} --lr 0",
    "sae -m builtin:ape --layer 1 --out {out} --batch-tokens 0",
    "sae -m builtin:ape --layer 1 --out {out} --buffer-tokens -1",
    "sae -m builtin:ape --layer 1 --out {out} --store {root}/no_such_store",
    "sae -m builtin:ape --layer 1 --out {out} --checkpoint-every -1",
    "sae -m builtin:ape --layer 1 --out {out} --epochs 0",
    # intervene ape-permute
    "intervene ape-permute -m builtin:ape --sae {root}/no_such_sae --out {out}",
    "intervene ape-permute -m builtin:rope-axial --sae {root}/sae_ape --out {out}",
    "intervene ape-permute -m builtin:ape --sae {root}/sae_ape --out {out} --seeds 0",
    "intervene ape-permute -m builtin:ape --sae {root}/sae_ape --out {out} --images 0",
    "intervene ape-permute -m builtin:fashion-ape --sae {root}/sae_ape --out {out}",
    "intervene ape-permute -m builtin:ape --sae {root}/sae_ape --out {out} --images 8",
    # intervene rope-axis / rope-heads
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore abc",
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore 99",
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore -2",
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore ,",
    "intervene rope-axis -m builtin:ape --out {out} --images 8",
    "intervene rope-axis -m builtin:rope-axial --out {out} --images 1",
    "intervene rope-heads -m builtin:rope-axial --out {out} --axis diag",
    "intervene rope-heads -m builtin:rope-axial --out {out} --restore-from 9",
    "intervene rope-heads -m builtin:rope-axial --out {out} --restore-from 0",
    "intervene rope-heads -m builtin:none --out {out}",
    # intervene rope-prefix
    "intervene rope-prefix -m builtin:rope-axial --out {out} --images 1",
    "intervene rope-prefix -m builtin:rope-axial --out {out} --block-from -1",
    "intervene rope-prefix -m builtin:rope-axial --out {out} --block-from 6",
    "intervene rope-prefix -m builtin:rope-axial --out {out} --restore-from 0",
    "intervene rope-prefix -m builtin:rope-axial --out {out} --restore-from 6",
    "intervene rope-prefix -m builtin:rope-axial --out {out} --attn-images 0",
    "intervene rope-prefix -m builtin:ape --out {out}",
    "intervene rope-prefix -m timm:vit_small_patch16_rope_224?img_size=32&patch_size=4&depth=1&embed_dim=32&num_heads=2"
    "&num_classes=4&class_token=False&global_pool=avg --out {out}",
    # intervene rope-freq
    "intervene rope-freq -m builtin:rope-axial --out {out} --images 1",
    "intervene rope-freq -m builtin:rope-axial --out {out} --bands 1",
    "intervene rope-freq -m builtin:rope-axial --out {out} --bands 7",
    "intervene rope-freq -m builtin:rope-axial --out {out} --windows 0-3",
    "intervene rope-freq -m builtin:rope-axial --out {out} --windows 2:2",
    "intervene rope-freq -m builtin:rope-axial --out {out} --windows 0:7",
    "intervene rope-freq -m builtin:rope-axial --out {out} --layers 6",
    "intervene rope-freq -m builtin:rope-axial --out {out} --layers x",
    "intervene rope-freq -m builtin:ape --out {out}",
    "intervene bogus",
    # extrapolate
    "extrapolate -m builtin:ape --out {out} --images 2",
    "extrapolate -m builtin:ape --out {out} --scales abc",
    "extrapolate -m builtin:ape --out {out} --scales 0",
    "extrapolate -m builtin:ape --out {out} --scales 1.05",
    "extrapolate -m builtin:rope-axial --out {out} --scales 1.5,1.55",
    # run
    "run --out {out} --models builtin:ape,builtin:nope",
    "run --out {out} --data nope",
    "run --out {out} --data digits",
    "run --out {out} --config {root}/missing.yaml",
    "run --out {out} --config {root}/missing_probe.yaml",
    "run --out {out} --config {root}/unknown.yaml",
    "run --out {out} --config {root}/list.yaml",
    "run --out {out} --config {root}/broken.yaml",
    "run --out {out} --config {root}/k0.yaml",
    "run --out {out} --config {root}/restore.yaml",
    "run --out {out} --config {root}/lr.toml",
    "run --out {out} --config {root}/scales.yaml",
    "run --out {root}/a_file --quick",
    "run --out {out} --seed -1",
    # refused before the first stage, and by --plan (exit 2) alike
    "run --plan --out {out} --models builtin:ape --config {root}/k_big.yaml",
    "run --out {out} --models builtin:ape --config {root}/k_big.yaml",
    "run --plan --out {out} --models builtin:ape --data shapes --config {root}/half.yaml",
    "run --plan --out {out} --quick --config {root}/axis_null.yaml",
    "run --plan --out {out} --quick --config {root}/axis_list.yaml",
    "run --plan --out {out} --config {root}/no_models.yaml",
    "run --plan --out {out} --config {root}/empty.yaml",
    "run --plan --out {out} --config {root}/latin1.yaml",
    "run --plan --out {out} --seed 18446744073709551616",
    "run --plan --out {out} --models builtin:ape,,builtin:none",
    "train --pe ape --out {out} --seed 18446744073709551616",
    "extrapolate -m builtin:ape --out {out} --scales 0.5",
    "extrapolate -m builtin:ape --out {out} --scales 1e300",
    "sae -m builtin:ape --layer 1 --out {out} --k 100000 --expansion 1",
    "eval -m timm:vit_small_patch16_224?img_size=32&patch_size=0",
    "eval -m timm:vit_small_patch16_224?img_size=32&patch_size=4&num_classes=nan",
    "eval -m timm:vit_small_patch16_224?img_size=32&patch_size=4&checkpoint_path={root}/evil.pt",
    "intervene ape-permute -m builtin:ape --sae {root}/sae_ape --out {out} --images 8 --seeds 100000",
    # a classification data set needs at least 2 classes
    "train --pe ape --quick --data imagefolder:{root}/one_class --out {out}",
    "head -m builtin:none --data imagefolder:{root}/one_class --images 4 --out {out}",
    "eval -m builtin:ape --data imagefolder:{root}/one_class --limit 4 --out {out}",
    "intervene rope-axis -m builtin:rope-axial --data imagefolder:{root}/one_class --images 8 --out {out}",
    "run --plan --quick --models builtin:none --data imagefolder:{root}/one_class --out {out}",
    # seeds: 0..SEED_MAX wherever a seed is an option
    "sae -m builtin:ape --layer 1 --out {out} --images 64 --stability-seed -1",
    "sae -m builtin:ape --layer 1 --out {out} --images 64 --stability-seed 9223372036854775808",
    "sae -m builtin:ape --layer 1 --out {out} --images 64 --seed -1",
    "probe -m builtin:ape --out {out} --images 8 --seed -1",
    "run --plan --out {out} --seed 9223372036854775808",
    # comma lists (one parser, vitpos.lists): an empty item or a repeated item is refused, never skipped
    "probe -m builtin:ape --out {out} --sites blocks.1.resid_post, --images 8",
    "capture -m builtin:ape --out {out} --sites blocks.0.resid_post,,blocks.1.resid_post --limit 4",
    "capture -m builtin:ape --out {out} --sites blocks.1.resid_post,blocks.1.resid_post --limit 4",
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore 1,1 --images 8",
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore 1,01 --images 8",
    "intervene rope-axis -m builtin:rope-axial --out {out} --restore 1, --images 8",
    "intervene rope-freq -m builtin:rope-axial --out {out} --layers 1,1 --images 8",
    "intervene rope-freq -m builtin:rope-axial --out {out} --windows 0:3,0:3 --images 8",
    "intervene rope-freq -m builtin:rope-axial --out {out} --windows 0:3, --images 8",
    "extrapolate -m builtin:ape --out {out} --scales 1.5,",
    "run --plan --out {out} --models builtin:ape,builtin:ape",
    "run --plan --out {out} --models builtin:ape --data shapes,",
]


def test_the_table_is_large_enough():
    assert len(CASES) >= 60 and len(set(CASES)) == len(CASES)


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_error_line(case, files, tmp_path, capsys):
    out = tmp_path / "out"
    argv = case.format(root=files, out=out).split()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    err_lines = [line for line in captured.err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, (case, captured.err[-800:])
    assert len(err_lines) == 1 and err_lines[0].startswith("error: "), (case, captured.err[-800:])
    assert "Traceback" not in captured.err and captured.out == ""
    # nothing half-written: a refused command leaves no output folder (or an empty one) behind
    assert not out.exists() or not any(out.iterdir()), (case, sorted(p.name for p in out.iterdir()))


def test_ctrl_c_exits_130_with_one_line_not_a_silent_0(tmp_path, capsys, monkeypatch):
    """typer turns a KeyboardInterrupt into Exit(130) and, outside standalone mode, returns its code:
    main() used to drop it, so Ctrl-C during `vitpos train` ended as exit 0 with no word."""
    import vitpos.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vitpos.train, "train", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--pe", "ape", "--quick", "--out", str(tmp_path / "out"), "--no-progress"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 130, captured.err
    assert [line for line in captured.err.splitlines() if line.strip()] == [
        "interrupted; rerun the same command to resume"]
    assert "Traceback" not in captured.err and captured.out == ""


def test_ctrl_c_during_zoo_train_exits_130_with_one_line(tmp_path, capsys, monkeypatch):
    """`vitpos zoo train pairs-ape` interrupted during data generation: exit 130 and the one resume line
    (as `vitpos train`), and --out is not created (nothing half-written to resume from)."""
    import vitpos.train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vitpos.train, "load_split", interrupted)  # the first thing training does: the data
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["zoo", "train", "pairs-ape", "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 130, captured.err
    assert [line for line in captured.err.splitlines() if line.strip()] == [
        "interrupted; rerun the same command to resume"]
    assert "Traceback" not in captured.err and captured.out == "" and not out.exists()


def test_hub_retry_warnings_stay_out_of_the_one_error_line(tmp_path, capsys, caplog, monkeypatch):
    """Offline, `--pretrained` had huggingface_hub print five 'Retrying in Ns' lines (its own stderr
    handler) before the one error line."""
    import logging

    import timm

    def offline(*args, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        raise OSError("Name or service not known")

    monkeypatch.setattr(timm, "create_model", offline)
    level = logging.getLogger("huggingface_hub").level
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "-m", "timm:vit_small_patch16_224?img_size=32&patch_size=4&depth=1&embed_dim=32&num_heads=2",
              "--pretrained", "--limit", "2", "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: pretrained weights"), err
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]  # the hub's warning was not emitted
    assert logging.getLogger("huggingface_hub").level == level  # the hub's logging is left as it was


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory):
    """4 train images of builtin:ape and of builtin:rope-axial at blocks.1.resid_post (same shapes), 2 per shard."""
    from vitpos.models import load_model
    from vitpos.store.capture import capture_to_store

    root = tmp_path_factory.mktemp("stores")
    for spec in ("builtin:ape", "builtin:rope-axial"):
        capture_to_store(load_model(spec), "shapes", "train", "blocks.1.resid_post", root / spec.split(":")[1],
                         limit=4, shard_images=2, progress=False)
    return root


@pytest.mark.parametrize("header", ["with-store-digest", "older-without-it"])
def test_a_store_shard_copied_from_another_models_store_is_refused(two_stores, header, tmp_path, capsys):
    """`vitpos sae --store ST`, ST's shards copied over from a store of another model (same shapes):
    trained on them and exited 0. New shards name their capture in their header; older ones are
    caught by recomputing each shard's first image."""
    import shutil

    from safetensors.torch import load_file, save_file

    st = tmp_path / "st"
    shutil.copytree(two_stores / "ape", st)
    for p in sorted((two_stores / "rope-axial").glob("shard-*.safetensors")):
        shutil.copy(p, st / p.name)
        if header == "older-without-it":
            from safetensors import safe_open

            with safe_open(str(p), "pt") as f:
                meta = {k: v for k, v in (f.metadata() or {}).items() if k != "store"}
            save_file(load_file(str(p)), str(st / p.name), metadata=meta)
    before = {q.name: q.read_bytes() for q in st.iterdir()}
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["sae", "-m", "builtin:ape", "--layer", "1", "--eval-images", "8", "--epochs", "1", "--expansion", "1",
              "--k", "4", "--batch-tokens", "64", "--store", str(st), "--out", str(out), "--no-progress"])
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), captured.err[-800:]
    assert "does not belong to" in err[0] and "shard-00000" in err[0] and captured.out == ""
    assert not out.exists() and {q.name: q.read_bytes() for q in st.iterdir()} == before


def test_a_late_refusal_cleans_the_folder_a_symlinked_out_points_at(tmp_path, capsys):
    """--out a symlink to a folder: a command refused after it began writing (an image truncated
    mid-way, read during the first epoch) leaves that folder as it found it, not a stray
    train_config.json (issue 30's hand-written sample 2)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2), ("test", 2)):
        for cls in ("a", "b"):
            (tmp_path / "imgs" / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                    tmp_path / "imgs" / split / cls / f"{i}.png")
    bad = tmp_path / "imgs" / "train" / "b" / "1.png"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "notes.txt").write_text("mine\n")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--pe", "ape", "--quick", "--epochs", "1", "--no-progress",
              "--data", f"imagefolder:{tmp_path / 'imgs'}", "--out", str(tmp_path / "link")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1 and "truncated" in err[0], err
    assert sorted(p.name for p in (tmp_path / "target").iterdir()) == ["notes.txt"]
    assert (tmp_path / "link").is_symlink()


def test_a_16_bit_grey_image_is_scaled_not_clipped_to_white_and_a_float_one_refused(tmp_path):
    """PIL's convert("RGB") clips 16-bit grey to 0..255, so a 16-bit PNG read as all white: a silently wrong
    input (issue 30's hand-written sample 2); 32-bit pixels have no known range and are refused in one line."""
    import numpy as np
    from PIL import Image

    from vitpos.data.imagefolder import _load_path
    from vitpos.errors import VitposError

    grey = np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) * 64  # 0..65472
    Image.fromarray(grey).save(tmp_path / "g16.png")
    rgb = np.asarray(_load_path(str(tmp_path / "g16.png")))
    assert rgb.shape == (32, 32, 3) and (rgb[..., 0] == (grey >> 8)).all()
    Image.fromarray(grey.astype(np.float32)).save(tmp_path / "f32.tiff")
    with pytest.raises(VitposError, match="32-bit 'F' pixels"):
        _load_path(str(tmp_path / "f32.tiff"))


def test_an_out_that_links_to_nothing_is_named_as_such(tmp_path, capsys):
    """--out a dangling symlink was "error: File exists (link)": true of the link, no help to the user
    (issue 30's hand-written sample 2). It names the missing target now, and the link stays."""
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(SystemExit) as exit_info:
        main(["capture", "-m", "builtin:ape", "--limit", "4", "--sites", "blocks.1.resid_post", "--no-progress",
              "--out", str(tmp_path / "link")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0] == f"error: --out {tmp_path / 'link'} is a link to {tmp_path / 'gone'}, which does not exist; " \
                     f"create {tmp_path / 'gone'} or pass another --out"
    assert (tmp_path / "link").is_symlink() and not (tmp_path / "gone").exists()


@pytest.mark.parametrize("plan", [False, True])
def test_a_run_whose_results_path_is_a_folder_is_refused_before_any_stage(tmp_path, capsys, plan):
    """OUT/results.json a folder: the run computed every stage, then failed on a temp file's name
    (issue 30's hand-written sample 2). It is refused first now, naming the path, --plan too."""
    out = tmp_path / "out"
    (out / "results.json").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--quick", "--no-progress", "--out", str(out), *(["--plan"] if plan else [])])
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and err == [
        f"error: {out / 'results.json'} is a folder, where the run writes its results.json; move it away and rerun"]
    assert sorted(p.name for p in out.iterdir()) == ["results.json"] and captured.out == ""
