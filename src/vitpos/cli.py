"""The `vitpos` command: the apps and their wiring, `vitpos run`, and the one error path every command
shares (`main`). The commands live in `vitpos.commands`: per-experiment ones generated from their
experiments' settings (`vitpos.commands.experiments`), the tools (`vitpos.commands.tools`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from vitpos.commands import experiments, tools
from vitpos.commands.options import COUNT_MAX, PROGRESS
from vitpos.commands.printing import console, one_line, out_console
from vitpos.errors import VitposError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Where do Vision Transformers keep spatial position? Probes, SAEs and causal tests for APE "
                       "and RoPE ViTs.")
intervene_app = typer.Typer(no_args_is_help=True,
                            help="Causal tests: ape-permute, rope-axis, rope-heads, rope-prefix, rope-freq.")
app.add_typer(intervene_app, name="intervene")
zoo_app = typer.Typer(no_args_is_help=True,
                      help="The matched positional-encoding zoo on `pairs`: list it, or retrain any member")
app.add_typer(zoo_app, name="zoo")
tools.register(app, zoo_app)
experiments.register(app, intervene_app)


@app.command()
def run(
    out: Path = typer.Option(Path("vitpos-out"), "--out", "-o", help="output directory (results.json, report.html)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="YAML or TOML settings; unknown keys are errors"),
    models: str | None = typer.Option(None, "--models", help="comma list of model specs (default: the shipped ones)"),
    data: str | None = typer.Option(None, "--data", "-d", help="comma list: pairs (the encoding zoo; the "
                            "default), shapes (the default of --quick), fashion, natural, regions, tiles, "
                            "imagefolder:PATH"),
    quick: bool = typer.Option(False, "--quick", help="small image counts: a minutes-long smoke run"),
    force: bool = typer.Option(False, "--force", help="recompute every stage"),
    pretrained: bool = typer.Option(False, "--pretrained", help="timm models: hub weights"),
    seed: int | None = typer.Option(None, "--seed"),
    model_seeds: int | None = typer.Option(None, "--model-seeds", help="shipped models per encoding: training "
                                           "seeds 0..N-1, N in 1..3 (default 1)"),
    top1_screen: int | None = typer.Option(
        None, "--top1-screen", min=0, max=COUNT_MAX,
        help="rope_heads' adaptive top-1: every head on this many images, the rest only for heads still in the "
             "race (default 500, rope_heads.top1_screen_images); 0: every head on every image"),
    progress: bool = PROGRESS,
    plan: bool = typer.Option(False, "--plan", help="print what the run would compute per model and stage (image "
                              "forwards, block evaluations, probe fits, estimated time) and exit; writes nothing"),
):
    """Run the whole study (eval, probes, SAE, APE and RoPE tests) and write results.json + report.html."""
    from vitpos.report.html import render_report
    from vitpos.study.config import load_config
    from vitpos.study.run import run_study

    overrides = {"models": _spec_list(models, "--models", "builtin:ape"), "data": _spec_list(data, "--data", "shapes"),
                 "seed": seed, "pretrained": pretrained or None, "model_seeds": model_seeds,
                 "rope_heads": None if top1_screen is None else {"top1_screen_images": top1_screen}}
    cfg = load_config(config, overrides, quick)
    if plan:
        _print_plan(out, cfg, quick, force)
        return
    cmd = "vitpos run " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "vitpos run"
    t0 = __import__("time").time()
    results = run_study(out, cfg, quick=quick, force=force, progress=progress, reproduce=cmd,
                        log=lambda msg: console.print(msg, highlight=False, markup=False, soft_wrap=True))
    render_report(results, out)
    t = Table("claim", "verdict", "headline per model family (95% interval)", "in one sentence")
    for c in results.summary.claims:
        t.add_row(c.id, c.verdict, escape("\n".join(h.text() for h in c.headlines)), escape(c.sentence))
    out_console.print(t)
    out_console.print(f"per-model numbers: folded under each claim in {out}/report.html", highlight=False)
    out_console.print(f"done in {__import__('time').time() - t0:.0f} s -> {out}/results.json, {out}/report.html")


def _spec_list(text: str | None, flag: str, example: str) -> list[str] | None:
    """A comma list option: None when not given; empty, with an empty entry or a repeat is an error, not the
    default."""
    from vitpos.lists import comma_items

    if text is None:
        return None
    if not text.strip():
        raise VitposError(f"{flag} is empty; name at least one, e.g. {flag} {example} (or leave {flag} out for the "
                          "defaults)")
    return comma_items(text, flag, example)


def _print_plan(out: Path, cfg, quick: bool, force: bool) -> None:
    from vitpos.study.run import plan_study

    study_plan = plan_study(out, cfg, quick=quick, force=force)
    header = ("model", "stage", "image-forwards", "block evals", "probe fits", "SAE tokens", "est.", "note")
    rows = []
    for s in study_plan.stages:
        p = s.plan
        if p is None:
            rows.append((s.model, s.stage, "", "", "", "", s.status, s.note))
            continue
        est = "" if s.seconds is None else f"{s.seconds:,.0f} s"
        rows.append((s.model, s.stage, f"{p.forwards:,}", f"{p.blocks:,}", f"{p.fits:,}", f"{p.sae_tokens:,}", est,
                     s.note))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:  # plain columns: the plan is meant to be pasted and diffed
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False))]
        out_console.print("  ".join(cells + [r[-1]]).rstrip(), soft_wrap=True)
    for model, problem in study_plan.data_problems.items():
        out_console.print(f"warning: {model}: the stages would stop: {one_line(problem)}", soft_wrap=True)
    out_console.print(study_plan.summary(), soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; every expected failure ends as one `error: ...` line on stderr and exit code 2,
    and leaves --out as the command found it (what it created there is removed; an interrupt keeps
    it, so that rerunning the command resumes)."""
    from vitpos.errors import OutputBusyError
    from vitpos.io import OutputGuard

    args = list(sys.argv[1:] if argv is None else argv)
    guard = OutputGuard(None)
    try:
        guard = OutputGuard(_out_arg(args), keep=_resume_points(args))
        code = app(args=args, standalone_mode=False)
        # typer (0.29 here) turns Ctrl-C into Exit(130) and, outside standalone mode, *returns* an Exit's
        # code instead of raising it (every command returns None): without this, an interrupt was a
        # silent exit 0
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            raise KeyboardInterrupt if code == 130 else SystemExit(code)
    except OutputBusyError as e:  # another process writes there: leave everything alone
        _fail(one_line(str(e)))
    except VitposError as e:
        _fail(one_line(str(e)) + _kept(guard.restore()))
    except KeyboardInterrupt:
        console.print("interrupted; rerun the same command to resume", highlight=False, markup=False)
        sys.exit(130)
    except OSError as e:  # full disk, permission, a path that is a file: the environment, not a bug
        kept = _kept(guard.restore())
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        _fail(f"{e.strerror or e}{where}; check that the output location is a writable directory with free space"
              + kept)
    except Exception as e:
        if type(e).__name__ not in ("Exit", "NoArgsIsHelpError", "Abort"):
            guard.restore()
        _usage_or_raise(e)


def _resume_points(args: list[str]) -> tuple[str, ...]:
    """What a failed command keeps in --out: `vitpos run`'s finished stages (OUT/stages, their files under
    OUT/artifacts), which a rerun resumes from; every other command's output is removed."""
    command = next((a for a in args if not a.startswith("-")), None)
    return ("stages", "artifacts") if command == "run" else ()


def _kept(paths: list[Path]) -> str:
    """The error line's tail when a failed run kept its finished stages."""
    if not paths:
        return ""
    return f"; the stages finished before it are kept ({paths[0]}): rerun the same command to resume from them"


def _out_arg(args: list[str]) -> Path | None:
    """The --out / -o folder named on the command line (None: none); an empty one is refused."""
    value = None
    for i, a in enumerate(args):
        if a == "--":
            break
        if a in ("--out", "-o") and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--out="):
            value = a[len("--out="):]
        elif a.startswith("-o") and len(a) > 2 and not a.startswith("--"):
            value = a[2:]
    if value is not None and not value.strip():
        raise VitposError("--out is empty; name an output folder, e.g. --out results")
    if value is None and args[:1] == ["run"]:
        value = "vitpos-out"  # run's default
    if value is not None and Path(value).is_symlink() and not Path(value).exists():
        target = os.readlink(value)
        raise VitposError(f"--out {value} is a link to {target}, which does not exist; create {target} "
                          "or pass another --out")
    return Path(value) if value is not None else None


def _usage_or_raise(e: Exception) -> None:
    """typer's own errors (it vendors click and does not re-export their classes: matched by name)."""
    kind = type(e).__name__
    ctx = getattr(e, "ctx", None)
    if kind == "NoArgsIsHelpError" and ctx is not None:  # bare `vitpos` / `vitpos intervene`: the help
        out_console.print(ctx.get_help())
        sys.exit(0)
    if kind == "Abort":
        console.print("interrupted; rerun the same command to resume", highlight=False, markup=False)
        sys.exit(130)
    if kind == "Exit":
        sys.exit(getattr(e, "exit_code", 0))
    if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # UsageError, BadParameter, NoSuchOption...
        cmd = ctx.command_path if ctx is not None else "vitpos"
        _fail(f"{one_line(e.format_message())} (see `{cmd} --help`)")  # type: ignore[attr-defined]
    if kind == "SafetensorError":  # safetensors reports a full disk or a truncated file as its own type
        _fail(f"could not read or write a .safetensors file ({one_line(str(e))}); check free disk space and "
              "that the file is complete")
    raise e


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
