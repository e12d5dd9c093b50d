"""Does ``configs/chu2023_priprune_prunefl.yaml`` run part B's PriPrune federation?

Part B of ``benchmarks/reproduce_chu2023.py`` builds PriPrune on PruneFL from
Python (``train_b``). The config writes the same federation for the engine
(``pruning.reconfigurations``, ``defenses: [{name: priprune}]``). This runs
both on real Fashion-MNIST at the current commit, with the settings recorded in
``benchmarks/results/chu2023_B.json``, and compares the global model's test
accuracy after every round: config run against ``train_b`` (expected: equal
to the last bit), and both against the accuracies that JSON recorded when it
was written (its own commit; float rounding may have moved since).

That JSON was written before a pruned weight was kept out of a Pseudo-Pruning
client's start model (``--pseudo-start kept``, see
``reproduce_chu2023.PSEUDO_STARTS``); the engine, the config and
``train_b``'s default now mask it. So ``train_b`` runs twice: with ``masked``
(against the config) and with ``kept`` (against the record, which it should
still reproduce), and the table shows what the change does to the
federation after the reconfiguration at round R/2. The record's observed
rounds completed their cohorts by ``observer.fill: sorted_cut``
(:func:`reproduce_chu2023.observer_fill_of`), the config's by its own fill
(``uniform``): the ``kept`` replay uses the record's, the ``masked`` run the
config's.

Usage: ``python -m benchmarks.chu2023_config_vs_part_b [--rounds R]``
(default: the config's 30). Writes
``benchmarks/results/chu2023_config_vs_part_b.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

CONFIG = ROOT / "configs" / "chu2023_priprune_prunefl.yaml"
PART_B = ROOT / "benchmarks" / "results" / "chu2023_B.json"
# Settings the config must share with part B's recorded run (else the comparison is moot).
SHARED = {"clients": "data.num_clients", "local_batch": "data.examples_per_client",
          "clients_per_round": "training.clients_per_round", "lr": "training.lr",
          "image_size": "data.image_size", "dataset": "data.dataset"}


def _get(cfg, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


def config_run(cfg, ds) -> list[float]:
    """The config's federation in the engine: test accuracy after each round."""
    from fedsim.simulation import Simulation

    sim = Simulation(cfg, dataset=ds, donate=True)
    state, acc = sim.init_state(), []
    for r in range(cfg.training.rounds):
        state, _ = sim.run_round(state, r)
        acc.append(sim.evaluate(state.params)[0])
    return acc


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of both runs (default: the config's); reconfigurations "
                         "stay at rounds 0 and R/2")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args_cli = ap.parse_args(argv)

    from benchmarks.reproduce_chu2023 import N_PAPER, fl_config, pseudo_start_of, train_b
    from fedsim.config import load_config
    from fedsim.data import load_dataset

    recorded = json.loads(PART_B.read_text())
    args = argparse.Namespace(**recorded["settings"])
    recorded_start = pseudo_start_of(args)
    rounds = args_cli.rounds or args.rounds
    args.rounds = rounds
    # Part B observes rounds 0, R/2 and R − 1 (its rounds axis); both runs here do too.
    observe = sorted({0, rounds // 2, rounds - 1})
    overrides = [f"training.rounds={rounds}",
                 f"pruning.reconfigure_every={max(rounds // args.reconfigs, 1)}",
                 "output.progress=false", "output.plots=false",
                 f"observer.rounds={json.dumps(observe)}"]
    cfg = load_config(str(CONFIG), overrides)
    mismatched = {k: (getattr(args, k), _get(cfg, v)) for k, v in SHARED.items()
                  if getattr(args, k) != _get(cfg, v)}
    if mismatched or cfg.pruning.reconfigurations != args.reconfigs:
        raise SystemExit(f"{CONFIG.name} no longer matches part B's recorded settings: "
                         f"{mismatched or 'reconfigurations'}")
    # seed: the synthetic dataset's own (real data has none); 0, the seed
    # this script has always loaded it with.
    ds = load_dataset(args.dataset, image_size=args.image_size, seed=0)

    # The config's federation (its observer.fill), and the record's (its own fill:
    # observer_fill_of gives sorted_cut for records made before the option).
    fl = fl_config(argparse.Namespace(**{**vars(args), "observer_fill": cfg.observer.fill}),
                   recorded["seed"], rounds, observe)
    fl_recorded = fl_config(args, recorded["seed"], rounds, observe)
    commit = git_commit()  # at start: the code this process loaded
    t0 = time.perf_counter()
    ref = train_b(argparse.Namespace(**{**vars(args), "pseudo_start": "masked"}), ds, fl,
                  "priprune")
    t_ref = time.perf_counter() - t0
    as_recorded = train_b(argparse.Namespace(**{**vars(args), "pseudo_start": recorded_start}),
                          ds, fl_recorded, "priprune")
    (spec,) = cfg.defenses
    if (spec["lambda_sha"], spec.get("reference_size")) != (args.lambda_sha, N_PAPER):
        raise SystemExit(f"{CONFIG.name}: lambda_sha {spec['lambda_sha']} for reference_size "
                         f"{spec.get('reference_size')} is not part B's {args.lambda_sha} "
                         f"for N_PAPER = {N_PAPER}")
    t0 = time.perf_counter()
    acc_cfg = config_run(cfg, ds)
    t_cfg = time.perf_counter() - t0
    acc_ref = [float(a) for a in ref["acc_by_round"]]
    row = next(r for r in recorded["rows"] if r.get("part") == "B"
               and r.get("defense") == "priprune")
    # Another round count moves the reconfiguration (round R/2): then the recorded
    # accuracies are of another federation and are not compared.
    acc_rec = ([float(a) for a in row["accuracy_by_round"]]
               if rounds == recorded["settings"]["rounds"] else [])
    acc_kept = [float(a) for a in as_recorded["acc_by_round"]]
    equal = [a == b for a, b in zip(acc_cfg, acc_ref)]
    same_as_recorded = [a == b for a, b in zip(acc_kept, acc_rec)]
    config_as_recorded = [a == b for a, b in zip(acc_cfg, acc_rec)]
    first_diff = next((i for i, s in enumerate(same_as_recorded) if not s), None)
    result = {
        "commit": commit, "device": f"{jax.default_backend()} ({platform.machine()})",
        "rounds": rounds, "config": str(CONFIG.relative_to(ROOT)),
        "recorded_commit": recorded["commit"], "recorded_pseudo_start": recorded_start,
        "config_equals_train_b_every_round": all(equal),
        "rounds_train_b_as_recorded_equals_recorded": int(sum(same_as_recorded)),
        "first_round_differing_from_recorded": first_diff,
        "max_abs_diff_to_recorded": max((abs(a - b) for a, b in zip(acc_kept, acc_rec)),
                                        default=0.0),
        "rounds_config_equals_recorded": int(sum(config_as_recorded)),
        "first_round_config_differs_from_recorded": next(
            (i for i, s in enumerate(config_as_recorded) if not s), None),
        "accuracy": {"config": acc_cfg, "train_b": acc_ref,
                     f"train_b_{recorded_start}": acc_kept, "recorded": acc_rec},
        "seconds": {"train_b": t_ref, "config": t_cfg},
    }
    lines = [
        "# chu2023: PriPrune on PruneFL as a config vs part B's own federation",
        "",
        f"Commit {short_commit(result['commit'])}, {result['device']}; "
        f"`python -m benchmarks.chu2023_config_vs_part_b"
        f"{'' if args_cli.rounds is None else f' --rounds {rounds}'}`. "
        f"Fashion-MNIST 16×16, part B's recorded settings ({PART_B.name}, written at "
        f"{short_commit(recorded['commit'])}), {rounds} rounds. Global model's test accuracy "
        "after each round.",
        "",
        f"- Config run equals `train_b` (`--pseudo-start masked`, the engine's semantics) "
        f"at every round (to the last bit): **{'yes' if all(equal) else 'NO'}**",
        (f"- `train_b` with `--pseudo-start {recorded_start}` (as {PART_B.name} was made): "
         f"rounds equal to its recorded accuracies {sum(same_as_recorded)} of {len(acc_rec)}; "
         f"largest difference {result['max_abs_diff_to_recorded']:.2e}"
         + ("" if first_diff is None else f" (first differing round: {first_diff})")
         if acc_rec else f"- Not compared with {PART_B.name}: it recorded "
         f"{recorded['settings']['rounds']} rounds, whose reconfiguration round differs"),
        (f"- Config run equal to the record: {sum(config_as_recorded)} of {len(acc_rec)} rounds"
         + ("" if result["first_round_config_differs_from_recorded"] is None else
            f" (first differing round: {result['first_round_config_differs_from_recorded']}; "
            f"the mask changes at round {rounds // args.reconfigs})") if acc_rec else ""),
        f"- Seconds: train_b {t_ref:.0f}, config {t_cfg:.0f}",
        "",
        f"| round | config | train_b (masked) | train_b ({recorded_start}) | recorded |",
        "|---|---|---|---|---|",
    ] + [f"| {r} | {a:.4f} | {b:.4f} | {c:.4f} | "
         f"{f'{acc_rec[r]:.4f}' if acc_rec else '—'} |"
         for r, (a, b, c) in enumerate(zip(acc_cfg, acc_ref, acc_kept))]
    write_json_and_markdown(args_cli.out, "chu2023_config_vs_part_b", result,
                            "\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()
