"""A stage rebuilt although cached (its artifact files were removed) rebuilds what reads it.

The SAE stage's result is cached, its dictionary lives under OUT/artifacts; remove the dictionary
and the next run retrains it. The retrained SAE is another SAE (another thread count or CPU gives
other floats, and with them other features), so the permutation (ape_permute), which permuted the
old SAE's features, must not be served from the cache beside it. The plan says the same."""

from __future__ import annotations

import json
import shutil

from vitpos.cli import main

MODEL = "builtin:ape"
SMALL = {"eval_images": 16, "probe": {"images": 16}, "sae": {"images": 64, "eval_images": 16, "epochs": 1,
                                                                 "expansion": 1, "stability": False, "browse": False},
         "ape_permute": {"images": 8, "seeds": 1}, "extrapolate": {"images": 8}}


def _states(text: str) -> dict[str, str]:
    """stage -> 'cached' / 'run' from the log of `vitpos run` (its '[model] stage ...' lines)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(f"[{MODEL}] "):
            stage, _, rest = line.removeprefix(f"[{MODEL}] ").partition(" ")
            if rest == "...":  # a stage served from the cache first and then rebuilt logs both
                out[stage] = "run"
            elif rest == "cached":
                out.setdefault(stage.rstrip(":"), "cached")
    return out


def _plan(text: str) -> dict[str, str]:
    return {line.split()[1]: ("cached" if line.rstrip().endswith("cached") else "run")
            for line in text.splitlines() if line.startswith(MODEL) and "n/a" not in line}


def test_removing_the_sae_files_recomputes_the_sae_and_the_permutation_that_reads_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("vitpos.study.run._validation", lambda cache, log: (None, 0.0))
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(SMALL))  # JSON is YAML
    out = tmp_path / "out"
    args = ["run", "--quick", "--no-progress", "--models", MODEL, "--config", str(config), "--out", str(out)]
    main(args)
    capsys.readouterr()
    main(args)
    text = capsys.readouterr()
    again = _states(text.out + text.err)
    assert again["sae"] == again["ape_permute"] == again["probe"] == "cached"

    sae_dirs = list((out / "artifacts").glob("*/sae"))
    assert len(sae_dirs) == 1
    shutil.rmtree(sae_dirs[0])
    main(["run", "--plan", *args[1:]])
    plan = _plan(capsys.readouterr().out)
    assert plan["sae"] == plan["ape_permute"] == "run" and plan["probe"] == plan["eval"] == "cached"

    main(args)
    text = capsys.readouterr()
    rebuilt = _states(text.out + text.err)
    said = " ".join((text.out + text.err).split())  # the console wraps long lines (and breaks the long path)
    assert f"[{MODEL}] sae: cached, but its files under" in said and "are gone or damaged: recomputing it" in said
    assert rebuilt["sae"] == rebuilt["ape_permute"] == "run"
    assert rebuilt["probe"] == rebuilt["extrapolate"] == "cached"  # what does not read the SAE stays cached
    assert (sae_dirs[0] / "sae.safetensors").is_file()
