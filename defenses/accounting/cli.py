"""``privacy`` sub-command: epsilon of DP-SGD (VMF / Gaussian), Bayes capacity.

Usage (the main CLI wires :func:`add_privacy_parser` into ``fedsim privacy``;
``python -m defenses.accounting.cli privacy ...`` works stand-alone):

  privacy vmf --kappa K --dim P --sample-rate Q (--steps T | --compositions N
              | --epochs E [--convention per-step|per-epoch]) --delta D [--json]
  privacy gaussian --sigma S --sample-rate Q (...same...) --delta D
              [--accountant rdp|pld] [--json]
  privacy dp-fedavg --sigma S --clients-per-round M --num-clients K --rounds R
              [--certain-rounds N] --delta D [--accountant rdp|pld] [--json]
  privacy capacity gaussian --sigma S --radius R --dim P [--json]
  privacy capacity vmf --kappa K --dim P [--json]

``vmf`` / ``gaussian`` / ``dp-fedavg`` print one JSON object with ``epsilon``, ``delta``,
``approach``, ``alpha``, ``convention``, ``count`` and ``candidates``.
``capacity`` prints ``log_bayes_capacity`` (natural log; JSON with --json).
The JSON is strict: an unbounded (infinite) ε is ``null``, named under
``non_finite``. Invalid input prints ``error: <argument> must be ...`` to
stderr and exits 2; running out of memory (the PLD accountant at a tiny σ)
prints ``error: out of memory ...`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Optional, Sequence

from defenses.accounting._composition import steps_for_epochs
from defenses.accounting._dp_fedavg import dp_fedavg_epsilon
from defenses.accounting._gaussian import gaussian_epsilon
from defenses.accounting._validation import (
    check_dim,
    check_nonnegative,
    check_open_unit,
    check_positive,
    check_positive_int,
    check_rate,
)
from defenses.accounting._vmf_accountant import vmf_epsilon
from defenses.bounds._bayes_capacity import log_bayes_capacity_gaussian, log_bayes_capacity_vmf

__all__ = ["add_privacy_parser", "run_privacy", "main"]

EXIT_USAGE = 2


class _UsageError(Exception):
    """Raised (instead of argparse's exit) so that errors stay one line."""


def _add_schedule(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--steps", type=float, help="number of DP-SGD steps T (standard, per-step)")
    group.add_argument("--compositions", type=float,
                       help="number of compositions N under paper 001's per-epoch convention")
    group.add_argument("--epochs", type=float,
                       help="epochs; converted with --convention (default per-step: T = ceil(E/Q))")
    p.add_argument("--convention", choices=["per-step", "per-epoch"], default=None,
                   help="how --epochs is counted (default per-step); only with --epochs")
    p.add_argument("--sample-rate", type=float, required=True, help="Poisson sampling rate Q in (0, 1]")
    p.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    p.add_argument("--json", action="store_true", help="print JSON (always the case for epsilon)")


def add_privacy_parser(subparsers) -> argparse.ArgumentParser:
    """Adds the ``privacy`` sub-command to an argparse subparsers object.

    Args:
      subparsers: the object returned by ``parser.add_subparsers()``.

    Returns:
      The ``privacy`` parser (its handler is stored as ``func=run_privacy``).
    """
    privacy = subparsers.add_parser("privacy", help="privacy accounting and Bayes capacity")
    privacy.set_defaults(func=run_privacy)
    sub = privacy.add_subparsers(dest="privacy_command", required=True)

    vmf = sub.add_parser("vmf", help="(eps, delta) of DP-SGD with VMF noise (001 §III-A)")
    vmf.add_argument("--kappa", type=float, required=True, help="VMF concentration, >= 0")
    vmf.add_argument("--dim", type=float, required=True, help="gradient dimension p, integer >= 2")
    _add_schedule(vmf)

    gauss = sub.add_parser("gaussian", help="(eps, delta) of DP-SGD with Gaussian noise")
    gauss.add_argument("--sigma", type=float, required=True, help="noise multiplier, > 0")
    gauss.add_argument("--accountant", choices=["rdp", "pld"], default="rdp")
    _add_schedule(gauss)

    fedavg = sub.add_parser("dp-fedavg", help="user-level (eps, delta) of DP-FedAvg "
                            "(McMahan et al. 2018), the engine's client_level_dp")
    fedavg.add_argument("--sigma", type=float, required=True, help="noise multiplier, > 0")
    fedavg.add_argument("--clients-per-round", type=float, required=True,
                        help="cohort size m (sample rate m/K)")
    fedavg.add_argument("--num-clients", type=float, required=True, help="number of clients K")
    fedavg.add_argument("--rounds", type=float, required=True,
                        help="rounds R, including --certain-rounds")
    fedavg.add_argument("--certain-rounds", type=float, default=0,
                        help="rounds that include the client for certain (default 0)")
    fedavg.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    fedavg.add_argument("--accountant", choices=["rdp", "pld"], default="rdp")
    fedavg.add_argument("--json", action="store_true", help="print JSON (always the case)")

    cap = sub.add_parser("capacity", help="log Bayes capacity (001 §V)")
    cap_sub = cap.add_subparsers(dest="capacity_mechanism", required=True)
    cg = cap_sub.add_parser("gaussian", help="Gaussian noise, inputs clipped to radius R (Thm 5)")
    cg.add_argument("--sigma", type=float, required=True, help="noise std per coordinate, > 0")
    cg.add_argument("--radius", type=float, required=True, help="clipping radius R, >= 0")
    cg.add_argument("--dim", type=float, required=True, help="dimension p, integer >= 2")
    cg.add_argument("--json", action="store_true")
    cv = cap_sub.add_parser("vmf", help="VMF noise on the sphere (Thm 6)")
    cv.add_argument("--kappa", type=float, required=True, help="VMF concentration, >= 0")
    cv.add_argument("--dim", type=float, required=True, help="dimension p, integer >= 2")
    cv.add_argument("--json", action="store_true")
    return privacy


def _schedule(args: argparse.Namespace) -> dict:
    q = check_rate("--sample-rate", args.sample_rate)
    check_open_unit("--delta", args.delta)
    if args.convention is not None and args.epochs is None:
        # It was ignored: "--steps 10 --convention per-epoch" printed a per-step ε.
        given = "--steps" if args.steps is not None else "--compositions"
        raise ValueError(f"--convention says how --epochs is counted; with {given} it does "
                         f"not apply (--steps counts DP-SGD steps, --compositions paper 001's "
                         f"per-epoch compositions)")
    if args.steps is not None:
        return {"steps": check_positive_int("--steps", args.steps)}
    if args.compositions is not None:
        return {"compositions": check_positive_int("--compositions", args.compositions)}
    epochs = check_positive("--epochs", args.epochs)
    if args.convention == "per-epoch":
        return {"compositions": check_positive_int("--epochs (per-epoch convention)", epochs)}
    return {"steps": steps_for_epochs(epochs, q)}


def _emit(payload: dict) -> None:
    """Print ``payload`` as strict JSON.

    A non-finite number (an unbounded ε: dp_accounting's RDP at a tiny σ, or
    paper 001's approach 1 at a large κ) is written ``null`` and named, with
    its value, under ``non_finite`` (``{"epsilon": "inf"}``): Python's
    ``Infinity`` is not JSON, and other readers refuse it.
    """
    non_finite: dict[str, str] = {}
    print(json.dumps(_finite_or_null(payload, "", non_finite)
                     | ({"non_finite": non_finite} if non_finite else {}),
                     sort_keys=True, allow_nan=False))


def _finite_or_null(value, path: str, non_finite: dict):
    if isinstance(value, dict):
        return {k: _finite_or_null(v, f"{path}{k}", non_finite) if not isinstance(v, dict)
                else _finite_or_null(v, f"{path}{k}.", non_finite) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        non_finite[path] = repr(value)  # 'inf', '-inf' or 'nan'
        return None
    return value


def run_privacy(args: argparse.Namespace) -> int:
    """Runs a parsed ``privacy`` command; returns the exit code.

    Args:
      args: namespace from a parser built with :func:`add_privacy_parser`.

    Returns:
      0 on success; 2 on invalid input (one-line message on stderr).
    """
    try:
        cmd = args.privacy_command
        if cmd == "vmf":
            kappa = check_nonnegative("--kappa", args.kappa)
            dim = check_dim("--dim", args.dim)
            sched = _schedule(args)
            res = vmf_epsilon(kappa, dim, args.sample_rate, args.delta, **sched)
            _emit({"mechanism": "vmf", "kappa": kappa, "dim": dim,
                   "sample_rate": args.sample_rate, **res.to_dict()})
        elif cmd == "gaussian":
            sigma = check_positive("--sigma", args.sigma)
            sched = _schedule(args)
            res = gaussian_epsilon(sigma, args.sample_rate, args.delta,
                                   accountant=args.accountant, **sched)
            _emit({"mechanism": "gaussian", "sigma": sigma,
                   "sample_rate": args.sample_rate, **res.to_dict()})
        elif cmd == "dp-fedavg":
            sigma = check_positive("--sigma", args.sigma)
            m = check_positive_int("--clients-per-round", args.clients_per_round)
            k = check_positive_int("--num-clients", args.num_clients)
            if m > k:
                raise ValueError(f"--clients-per-round ({m}) must be at most --num-clients ({k})")
            rounds = check_positive_int("--rounds", args.rounds)
            certain = args.certain_rounds
            if not (math.isfinite(certain) and certain >= 0 and certain == int(certain)):
                raise ValueError(f"--certain-rounds must be an integer >= 0, got {certain!r}")
            certain = int(certain)
            if certain > rounds:
                raise ValueError(f"--certain-rounds ({certain}) must be at most --rounds "
                                 f"({rounds})")
            delta = check_open_unit("--delta", args.delta)
            res = dp_fedavg_epsilon(sigma, m / k, delta, sampled_rounds=rounds - certain,
                                    certain_rounds=certain, accountant=args.accountant)
            _emit({"mechanism": "dp_fedavg", "sigma": sigma, "clients_per_round": m,
                   "num_clients": k, "sample_rate": m / k, "certain_rounds": certain,
                   **res.to_dict()})
        elif cmd == "capacity":
            if args.capacity_mechanism == "gaussian":
                sigma = check_positive("--sigma", args.sigma)
                radius = check_nonnegative("--radius", args.radius)
                dim = check_dim("--dim", args.dim)
                val = log_bayes_capacity_gaussian(sigma, radius, dim)
                payload = {"mechanism": "gaussian", "sigma": sigma, "radius": radius, "dim": dim}
            else:
                kappa = check_nonnegative("--kappa", args.kappa)
                dim = check_dim("--dim", args.dim)
                val = log_bayes_capacity_vmf(kappa, dim)
                payload = {"mechanism": "vmf", "kappa": kappa, "dim": dim}
            if args.json:
                _emit({**payload, "log_bayes_capacity": val,
                       "log10_bayes_capacity": val / math.log(10.0)})
            else:
                print(f"{val:.10g}")
        else:  # argparse enforces the choice; kept for direct callers
            raise ValueError(f"unknown privacy command {cmd!r}")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except ArithmeticError as err:
        # dp_accounting (or our own sums) at settings far outside any use, e.g.
        # --sigma 1e-300 (ZeroDivisionError) or 1e300 (OverflowError).
        print(f"error: the {args.privacy_command} accountant's arithmetic failed at these "
              f"settings ({type(err).__name__}: {err}); they are outside the range it can "
              "evaluate (check --sigma, --sample-rate and the step count)", file=sys.stderr)
        return 1
    except MemoryError as err:
        # dp_accounting's PLD discretises the privacy loss on a grid that grows
        # as σ shrinks (38 GiB at σ = 1e-3, q = 0.1, 10 steps).
        hint = ("; the PLD accountant's grid grows as --sigma shrinks: try --accountant rdp"
                if getattr(args, "accountant", None) == "pld" else "")
        print(f"error: out of memory computing the {args.privacy_command} accountant "
              f"({str(err) or type(err).__name__}){hint}", file=sys.stderr)
        return 1
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, no usage dump
        raise _UsageError(message)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Stand-alone entry: ``python -m defenses.accounting.cli privacy ...``."""
    parser = _Parser(prog="python -m defenses.accounting.cli")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_privacy_parser(subparsers)
    try:
        args = parser.parse_args(argv)
    except _UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return args.func(args)


# ``fedsim privacy ...``: entry point of the ``fedsim.commands`` group.
register = add_privacy_parser


if __name__ == "__main__":
    sys.exit(main())

