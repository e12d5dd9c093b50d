"""SGI's mask on part A's p axis: the upload's zeros against Alg 2's 1[w_g + Δ ≠ 0] (issue #7).

Until 2026-11-27 SGI read its mask off the upload's zeros (``mask: support``),
which also drops every shared weight whose change is exactly 0 (the weights of
ReLU units dead for the whole batch). Alg 2 line 3 reads it off the client's
weights (``mask: model``, now the default), which keeps them. The committed
headline (``chu2023_A.json``, 06191db) was made with ``support``, and its
check "SGI ≥ GI in PSNR at every p" failed at 3 of 19 settings.

This rebuilds that run's Conv-2 p axis (its key streams, victims and job order,
so every victim gets the attack key and labels it had) and attacks it with SGI
under both masks, each in one call over all victims as part A did, beside the
recorded GI and SGI rows. The ``support`` rerun is the control: it should
equal the recorded SGI rows, showing that the rebuild and the convolution rule
reproduce them (part A was recorded before vmapped convolutions took im2col:
the ``xla`` rule); GI is rerun on the first setting's victims only.

Usage: ``python -m benchmarks.diagnose_sgi_mask`` →
``benchmarks/results/sgi_mask.{json,md}``. ~30 min on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_file import read_or_exit  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def part_a_order(pairs: dict, rates) -> list:
    """The (scheme, p) settings of part A's (Conv-2, p-axis batch) group, in the order
    part A attacked them (:func:`reproduce_chu2023.part_a`): every scheme at every
    rate, then PruneFL at 0.3, the other axes' reference, where 0.3 is no rate."""
    from defenses.pruning.schemes import SCHEMES

    order = [(s, p) for s in SCHEMES for p in rates]
    if 0.3 not in rates:
        order.append(("prunefl", 0.3))
    missing = [k for k in order if k not in pairs]
    if missing:
        raise ValueError(f"the result lacks part-A p-axis rows for {missing}")
    return order


def attack(observations, config, key, rule, subset):
    """SGI (``rule``: "model", "support") or GI (``rule`` None) on ``observations``
    with the keys and labels of one call over all of them; only ``subset`` attacked."""
    import jax

    from attacks import sgi
    from attacks.gradient_inversion import (inversion_config, invert_victims,
                                            prepare_victims)
    from attacks.inverting_gradients import DEFAULTS
    from attacks.labels import observed_gradient

    overrides = {} if rule is None else {"masked": True, "mask_in_target": rule == "model"}
    cfg, merged = inversion_config(config, DEFAULTS, overrides)
    masks = {id(o): sgi.model_mask(o) for o in observations} if rule == "model" else {}
    target_fn = ((lambda o: {"gradient": observed_gradient(o), "mask": masks[id(o)]})
                 if rule == "model" else observed_gradient)
    bs, params, targets, labels, keys, _, shared = prepare_victims(
        observations, merged, cfg, key, target_fn)
    idx = np.asarray(subset)
    take = lambda t: jax.tree_util.tree_map(lambda a: a[idx], t)
    first = observations[0]
    out = invert_victims(first.apply_fn, cfg, params if shared else take(params), take(targets),
                         labels[idx], keys[idx], batch_size=bs,
                         input_shape=tuple(first.input_shape), num_classes=first.num_classes,
                         shared_params=shared)
    return out["x"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--result", default=str(RESULTS / "chu2023_A.json"))
    ap.add_argument("--conv", default="xla", help="convolution rule the result was made under")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    from benchmarks.diagnose_sgi_vs_gi import p_axis_of, rebuild
    from benchmarks.reproduce_chu2023 import part_a_key, score
    from fedsim import models

    result = read_or_exit(ap, args.result, "--result")
    if result["settings"].get("a_protocol", "pruned_model") != "pruned_model":
        raise SystemExit("diagnose_sgi_mask: a part A made under the pruned_model protocol")
    pairs = p_axis_of(result)
    order = part_a_order(pairs, result["settings"]["rates"])
    B = pairs[order[0]]["sgi"]["B"]
    built = {(s, p): (obs, xs) for s, p, obs, xs, _ in rebuild(result, "pruned_model")}
    obs_all, truths = [], []
    for k in order:
        obs_all += built[k][0]
        truths += built[k][1]
    V = len(built[order[0]][0])
    key, key_name = part_a_key(result["seed"], "attack", "conv2", B)
    if pairs[order[0]]["sgi"].get("attack_key") != key_name:
        raise SystemExit(f"the rows' attack key is not {key_name}")
    config = result["settings"]["attack"]
    commit = git_commit()  # at start: the code this process loaded
    t0 = time.perf_counter()
    with models.conv_implementation(args.conv):
        x_gi = attack(obs_all, config, key, None, range(V))
        x_sgi = {rule: attack(obs_all, config, key, rule, range(len(obs_all)))
                 for rule in ("support", "model")}
    seconds = time.perf_counter() - t0

    gi_first = [score(x, t)[1] for x, t in zip(x_gi, truths[:V])]
    rows, equal = [], 0
    for j, (scheme, p) in enumerate(order):
        sc = {m: [score(x_sgi[m][j * V + v], truths[j * V + v]) for v in range(V)]
              for m in ("support", "model")}
        gi, sg = pairs[(scheme, p)]["gi"], pairs[(scheme, p)]["sgi"]
        rerun = [b for _, b in sc["support"]]
        equal += sum(abs(a - b) <= 1e-4 for a, b in zip(rerun, sg["psnr_victims"]))
        rows.append({"base": scheme, "p": p, "B": B,
                     "gi_psnr": gi["psnr"], "sgi_support_recorded_psnr": sg["psnr"],
                     "sgi_support_psnr": float(np.mean(rerun)),
                     "sgi_model_psnr": float(np.mean([b for _, b in sc["model"]])),
                     "gi_psnr_victims": gi["psnr_victims"],
                     "sgi_support_recorded_psnr_victims": sg["psnr_victims"],
                     "sgi_support_psnr_victims": rerun,
                     "sgi_model_psnr_victims": [b for _, b in sc["model"]],
                     "sgi_model_nmi_victims": [a for a, _ in sc["model"]]})
    holds = {m: [r for r in rows if r[f"sgi_{m}_psnr"] >= r["gi_psnr"]]
             for m in ("support_recorded", "support", "model")}
    out = {"commit": commit, "device": f"cpu ({platform.machine()})",
           "result": Path(args.result).name, "result_commit": result["commit"],
           "convolution": args.conv, "attack": config, "attack_key": key_name,
           "victims_per_setting": V, "seconds": seconds,
           "control": {"gi_setting": list(order[0]),
                       "gi_recorded": pairs[order[0]]["gi"]["psnr_victims"],
                       "gi_rerun": gi_first,
                       "sgi_support_victims_equal": f"{equal}/{len(obs_all)}"},
           "sgi_ge_gi": {m: f"{len(h)}/{len(rows)}" for m, h in holds.items()},
           "rows": rows}
    write(out, Path(args.out))
    return out


def write(out: dict, folder: Path) -> None:
    """``sgi_mask.json`` and ``.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sgi_mask.json").write_text(json.dumps(out, indent=1))
    c = out["control"]
    lines = [
        "# SGI's mask on part A's p axis: the upload's zeros (support) against Alg 2's "
        "1[w_g + Δ ≠ 0] (model)", "",
        f"Produced by `python -m benchmarks.diagnose_sgi_mask` at commit "
        f"{short_commit(out['commit'])} ({out['device']}, convolution rule "
        f"`{out['convolution']}`), {out['seconds']:.0f} s. Rebuilt from `{out['result']}` "
        f"(commit {short_commit(out['result_commit'])}): Conv-2 at its initial model, "
        f"{out['victims_per_setting']} victims per setting, the run's attack key "
        f"`{out['attack_key']}` and settings {out['attack']}. GI is the recorded rows; "
        "SGI is attacked here under both masks, each in one call over all victims with each "
        "victim's recorded key and labels.", "",
        f"- Control: SGI (support) rerun equals the recorded per-victim PSNR (to 1e-4 dB) for "
        f"{c['sgi_support_victims_equal']} victims; GI rerun on {c['gi_setting'][0]} "
        f"p = {c['gi_setting'][1]}: {_fmt(c['gi_rerun'])} (recorded {_fmt(c['gi_recorded'])})",
        f"- SGI ≥ GI in mean PSNR: support (recorded) {out['sgi_ge_gi']['support_recorded']}, "
        f"support (rerun) {out['sgi_ge_gi']['support']}, model {out['sgi_ge_gi']['model']} "
        "settings", "",
        "| scheme | p | GI PSNR | SGI support (recorded) | SGI support (rerun) | SGI model "
        "| model − support (rerun) | model − GI |",
        "|---|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['base']} | {r['p']} | {r['gi_psnr']:.2f} | "
                     f"{r['sgi_support_recorded_psnr']:.2f} | {r['sgi_support_psnr']:.2f} | "
                     f"{r['sgi_model_psnr']:.2f} | "
                     f"{r['sgi_model_psnr'] - r['sgi_support_psnr']:+.2f} | "
                     f"{r['sgi_model_psnr'] - r['gi_psnr']:+.2f} |")
    (folder / "sgi_mask.md").write_text("\n".join(lines) + "\n")


def _fmt(values) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    main()
