"""``fedsim`` command line.

Commands: ``run``, ``report``, ``compare``, ``sweep`` and ``list`` (this
module), plus commands contributed by the other
packages through the ``fedsim.commands`` entry-point group (``attack`` from
:mod:`attacks`, ``privacy`` from :mod:`defenses`), so the engine never imports
the attack package.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from importlib import metadata

from fedsim.config import ConfigError, load_config


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run a federated simulation from a YAML config")
    p.add_argument("config", help="path to a YAML config (e.g. configs/quickstart.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (dotted path, unique leaf name, or "
                        "defenses[i].PARAM)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    from fedsim import distributed

    distributed.add_arguments(p)
    p.set_defaults(func=_cmd_run)


def _cmd_run(args) -> int:
    from fedsim.run import run_dir_for, run_simulation

    cfg = load_config(args.config, args.overrides)
    from fedsim import distributed
    from fedsim.simulation import enable_config_dtype

    distributed.initialize_from_args(args)  # before anything touches a device
    enable_config_dtype(cfg)  # training.dtype float64: 64-bit JAX for this process
    summary = run_simulation(cfg, quiet=args.quiet)
    summary.pop("final_state", None)
    if distributed.is_primary():  # the process that wrote the run directory
        print(json.dumps(summary, indent=2))
        print(f"run directory: {run_dir_for(cfg)}", file=sys.stderr)
        if cfg.attack is not None:  # the run is not over for `fedsim compare`
            print(f"note: {args.config} has an `attack` section, which `fedsim run` does not "
                  "run: `fedsim attack` trains and attacks (`fedsim compare` shows this run "
                  "as 'attack pending' until its attack_summary.json exists)", file=sys.stderr)
    return 0


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="summarise a finished run directory, or print a sweep's table")
    p.add_argument("run_dir", help="a directory written by `fedsim run` or `fedsim attack`, or a "
                                   "sweep's directory")
    p.set_defaults(func=_cmd_report)


def _add_list(sub) -> None:
    p = sub.add_parser("list", help="what a config can name: models, datasets, pruning schemes, "
                                    "defenses (with their parameters), attacks")
    p.add_argument("section", nargs="?", default=None,
                   help="one section (models, datasets, schemes, defenses, attacks); "
                        "every section without it")
    p.set_defaults(func=_cmd_list)


def _cmd_list(args) -> int:
    from fedsim.listing import render, sections
    from fedsim.suggest import did_you_mean

    found = sections()
    if args.section is not None:
        if args.section not in found:
            print(f"fedsim: error: unknown section {args.section!r}; known: "
                  f"{', '.join(found)}{did_you_mean(args.section, found)}", file=sys.stderr)
            return 2
        found = {args.section: found[args.section]}
    print(render(found), end="")
    return 0


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="several runs side by side: a table, and with --out "
                                       "their learning curves in one plot")
    p.add_argument("runs", nargs="+", metavar="DIR",
                   help="run directories (finished or not), or sweeps' directories (their cells)")
    p.add_argument("--out", metavar="PNG", help="write test accuracy and train loss per round, "
                                                 "one line per run, to this PNG (.png added "
                                                 "where it has no extension)")
    p.set_defaults(func=_cmd_compare)


def _cmd_compare(args) -> int:
    from fedsim.compare import compare, plot_path

    print(compare(args.runs, args.out), end="")
    if args.out:
        print(f"plot: {plot_path(args.out)}", file=sys.stderr)
    return 0


def _cmd_report(args) -> int:
    from pathlib import Path

    from fedsim.results import (plot_learning_curve, read_attack_summary, read_json_object,
                                read_metrics)

    run_dir = Path(args.run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file() and (run_dir / "results.md").is_file():  # a sweep's directory
        print((run_dir / "results.md").read_text(), end="")
        return 0
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} not found: is {run_dir} a finished fedsim run "
                                "or a sweep's directory?")
    summary = read_json_object(summary_path)
    rows = read_metrics(run_dir / "metrics.jsonl")
    print(json.dumps(summary, indent=2))
    extra = _extra_columns(rows)
    print(f"{'round':>6} {'train_loss':>11} {'test_acc':>9} {'seconds':>8}"
          + "".join(f" {k:>{max(len(k), 10)}}" for k in extra))
    for r in rows:
        acc = r.get("test_accuracy")
        print(f"{r['round']:>6} {_number(r['train_loss']):>11.4f} "
              f"{'' if acc is None else f'{_number(acc):.4f}':>9} "
              f"{_number(r.get('seconds', 0)):>8.2f}"
              + "".join(f" {'' if k not in r else f'{_number(r[k]):.4g}':>{max(len(k), 10)}}"
                        for k in extra))
    if rows:
        plot = run_dir / "learning_curve.png"
        try:
            plot_learning_curve(rows, plot)
        except OSError as e:  # a read-only or another user's run, a directory in the way
            # The report is what was asked for: the plot is a by-product.
            print(f"fedsim: warning: {plot} not written ({type(e).__name__}: "
                  f"{e.strerror or e})", file=sys.stderr)
    attack_path = run_dir / "attack_summary.json"
    if attack_path.is_file():  # a `fedsim attack` run: its victims too
        attack = read_attack_summary(attack_path)
        victims, mean = attack.get("victims", []), attack.get("mean", {})
        print(f"attack {attack.get('attack')} (grants {attack.get('grants')}):")
        print(f"{'client':>6} {'round':>6} {'psnr':>7} {'ssim':>6} {'nmi':>6} {'mse':>9} "
              f"{'label_acc':>9}")
        for v in victims:
            print(f"{str(v.get('client', '?')):>6} {str(v.get('round', '?')):>6} "
                  + _metric_columns(v))
        print(f"{'mean':>13} " + _metric_columns(mean))
    return 0


# metrics.jsonl keys every run has (the table's first columns, or not per-round numbers).
_BASE_ROW_KEYS = {"round", "train_loss", "test_accuracy", "test_loss", "seconds", "clients",
                  "skipped_clients"}


def _extra_columns(rows: list[dict]) -> list[str]:
    """The numeric keys a defense's round callbacks added to the rows (``epsilon``,
    ``leakage_total``, ``priprune_rate``, ...), in the order they first appear."""
    seen: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if k not in _BASE_ROW_KEYS and isinstance(v, (int, float)) \
                    and not isinstance(v, bool):
                seen.setdefault(k)
    return list(seen)


def _number(value) -> float:
    """``value`` as a float for a table; NaN for what is not a number (a hand-edited file)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else float("nan")


def _metric_columns(m: dict) -> str:
    """PSNR, SSIM, NMI, MSE and label accuracy of ``m`` (NaN where missing)."""
    return (f"{_number(m.get('psnr')):>7.2f} {_number(m.get('ssim')):>6.3f} "
            f"{_number(m.get('nmi')):>6.3f} {_number(m.get('mse')):>9.2e} "
            f"{_number(m.get('label_acc')):>9.2f}")


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of configs (skips finished cells, resumes partial)")
    p.add_argument("config", help="base YAML config")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a grid axis (repeatable); KEY as for --set (defenses[i].PARAM included)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every cell")
    p.add_argument("--out", default=None, help="sweep directory (default sweeps/<config name>)")
    from fedsim import distributed

    distributed.add_arguments(p)
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args) -> int:
    return run_sweep_command(args)


def run_sweep_command(args, sweep=None) -> int:
    """``fedsim sweep`` (and ``fedsim attack --grid``): run the grid, say where its table is.

    Args:
      args: parsed ``config``, ``grid``, ``overrides``, ``out`` and process flags.
      sweep: ``sweep(config, grid, out, overrides, log=...) -> rows``
        (default :func:`fedsim.sweep.run_sweep`).

    Returns:
      0 if every cell is done, else 1.
    """
    from pathlib import Path

    from fedsim import distributed
    from fedsim.sweep import run_sweep

    out = args.out or f"sweeps/{Path(args.config).stem}"
    distributed.initialize_from_args(args)  # before anything touches a device
    rows = (sweep or run_sweep)(args.config, args.grid, out, args.overrides,
                                log=lambda m: print(m, file=sys.stderr))
    if distributed.is_primary():
        print(f"results: {out}/results.md", file=sys.stderr)
    return 0 if all(r["status"].startswith("done") for r in rows) else 1


def _plugin_commands():
    try:
        eps = metadata.entry_points(group="fedsim.commands")
    except Exception:  # pragma: no cover
        return []
    return list(eps)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_report(sub)
    _add_compare(sub)
    _add_sweep(sub)
    _add_list(sub)
    for ep in _plugin_commands():
        try:
            ep.load()(sub)
        except ModuleNotFoundError:
            continue  # the package providing this command is not installed
        except Exception as e:  # a broken plugin must not break `fedsim run`
            print(f"fedsim: warning: command {ep.name!r} unavailable: {e}", file=sys.stderr)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from fedsim.compile_cache import enable_persistent_cache

    from fedsim.memory import check_enabled

    try:
        enable_persistent_cache()
        check_enabled()  # a bad FEDSIM_MEMORY_CHECK is named before anything runs
    except ValueError as e:
        print(f"fedsim: error: {e}", file=sys.stderr)
        return 2
    from fedsim import distributed

    # Several processes: a process that stops alone may leave the others waiting
    # for it in a collective, and JAX's shutdown barrier at its exit would wait
    # for them (up to five minutes) in turn. Such a process leaves at once
    # (distributed.leave), which ends their collectives.
    try:
        code = _run_command(args)
    except distributed.PeerFailure as e:
        print(f"fedsim: error: {e}", file=sys.stderr)
        distributed.leave(2)
    except BaseException:
        if not distributed.joined():
            raise
        traceback.print_exc()
        print("fedsim: error: this process stopped with the error above; the run's other "
              "processes stop too", file=sys.stderr)
        distributed.leave(1)
    if code != 0 and distributed.joined():
        # Ended alike in every process (a NaN, SIGTERM): exit through the
        # barrier, together. Otherwise leave.
        try:
            distributed.check_in_step("the command", f"exit code {code}", key="exit")
        except distributed.PeerFailure as e:
            print(f"fedsim: error: {e}", file=sys.stderr)
            distributed.leave(code)
    return code


def _run_command(args) -> int:
    """The command's exit code; known errors as one line on stderr instead of a traceback."""
    from fedsim.distributed import DistributedError, PeerFailure
    from fedsim.preemption import Preempted

    try:
        return int(args.func(args) or 0)
    except PeerFailure:  # main leaves at once
        raise
    except DistributedError as e:  # command-line arguments, the setting across processes
        print(f"fedsim: error: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"fedsim: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedsim: interrupted", file=sys.stderr)
        return 130
    except Preempted as e:  # SIGTERM, at a round boundary
        print(f"fedsim: {e}", file=sys.stderr)
        return 143  # 128 + SIGTERM, as a process ended by the signal reports
    except Exception as e:  # a clear one-line message for known failures
        from fedsim.data import DatasetError
        from fedsim.checkpoint import CheckpointError
        from fedsim.results import RunFileError
        from fedsim.simulation import NonFiniteError

        # FloatingPointError: an attack whose every restart ended NaN/Inf says
        # so and what to change; the traceback would add nothing to that.
        if isinstance(e, (DatasetError, NonFiniteError, CheckpointError, FileNotFoundError,
                          FloatingPointError, RunFileError)):
            print(f"fedsim: error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
