"""Why GI and SGI give the same reconstruction on part B's Largest uploads (issue #7).

In ``chu2023_B.json`` the real-Largest rows (PruneFL + Largest p̂ = 0.3, weight
uploads) have GI and SGI reconstructions with identical NMI and PSNR, to the last
digit, at both attacked clients, although the two attack losses differ (SGI 1e-6,
GI ~0.5–1). The global model there has collapsed to chance (accuracy 0.1000).

This script rebuilds part B's federation for the named defenses through
``reproduce_chu2023.train_b`` from the settings the results file records, checks
it rebuilt it (the global model's accuracy after every round must equal the rows'
``accuracy_by_round``), and, for the two clients attacked in the last round,
measures:

* the model the server sent (the attacked one): the fraction of each hidden
  layer's units that are active (ReLU input > 0) for some example of the victim's
  batch and of 1000 test images, the spread of the logits over those test images,
  and ‖∇ₓ CE‖ of the victim's true batch;
* each attack's gradient-matching term, with the TV prior left out, against the
  TV prior the attack adds to it (``tv`` × ∇ₓ TV): at the attack's own
  reconstruction, the share of pixels where adding the matching term changes the
  sign of the step. The inverting-gradients optimizer steps on the *sign* of the
  gradient (``signed``), so where that share is 0 the matching term cannot steer
  the dummy, and GI and SGI, which start from the same dummy, take the same TV
  steps;
* both attacks re-run with the victims' own keys from part B's attack stream
  (their positions among part B's victims), their NMI/PSNR beside the rows', and
  the largest pixel difference between the GI and SGI reconstructions.

Usage: ``python benchmarks/diagnose_largest_collapse.py`` (default: the
committed ``chu2023_B.json``; ``--defenses none,largest``) →
``benchmarks/results/largest_collapse.{json,md}``. Another defense of another
part-B file, under another name: ``--results
benchmarks/results/chu2023_B_fig4.json --defenses mix --name mix_collapse``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, too

RESULTS = Path(__file__).resolve().parent / "results"
HIDDEN = ("Conv_0", "Conv_1", "Dense_0")  # Conv-2's ReLU layers (flax module names)


def part_b_victims(rows: list[dict]) -> tuple[int, dict]:
    """(V, {(defense, round, client): position}) of part B's attacked uploads.

    ``part_b`` appends one SGI and one GI row per victim, in the order the attack
    keys were split over, so a victim's position is its index among the SGI rows.
    """
    b = [r for r in rows if r["part"] == "B" and r["attack"] == "sgi"]
    return len(b), {(r["defense"], r["round"], r["client_id"]): i for i, r in enumerate(b)}


def rows_of(rows, defense, rnd, client) -> dict:
    """{"sgi": row, "gi": row} of one attacked upload."""
    return {r["attack"]: r for r in rows if r["part"] == "B" and r["defense"] == defense
            and r["round"] == rnd and r["client_id"] == client}


def unit_activity(model, params, x) -> dict:
    """Per hidden layer: the fraction of units (channels / neurons) active for some
    example of ``x``, and the fraction of all pre-activations that are > 0."""
    _, inter = model.apply({"params": params}, x, capture_intermediates=True,
                           mutable=["intermediates"])
    out = {}
    for name in HIDDEN:
        pre = np.asarray(inter["intermediates"][name]["__call__"][0])
        units = pre.reshape(-1, pre.shape[-1])
        out[name] = {"units_ever_active": float(np.mean((units > 0).any(axis=0))),
                     "active_share": float(np.mean(units > 0))}
    return out


def attack_cfg(config: dict, masked: bool, mask_in_target: bool = False):
    """``(cfg, merged)`` of inverting_gradients (``masked``: sgi; ``mask_in_target``:
    SGI's mask comes with the target, the ``model`` rule) for ``config``, as
    ``run_inversion`` builds them."""
    from attacks.gradient_inversion import inversion_config
    from attacks.inverting_gradients import DEFAULTS
    overrides = {"masked": masked, **({"mask_in_target": True} if mask_in_target else {})}
    return inversion_config(config, DEFAULTS, overrides)


def sign_steering(apply_fn, cfg, params, target, labels, x, num_classes) -> dict:
    """At inputs ``x``: the matching term's and the TV term's input gradients, and the
    share of pixels where the matching term changes the sign of the total."""
    import jax
    import jax.numpy as jnp

    from attacks.gradient_inversion import make_objective, make_simulate, total_variation
    match = make_objective(make_simulate(apply_fn, dataclasses.replace(cfg, tv=0.0)),
                           dataclasses.replace(cfg, tv=0.0), num_classes)
    z = {"x": jnp.asarray(x), "y": jnp.zeros((x.shape[0], num_classes))}
    gm = np.asarray(jax.grad(lambda z: match(z, params, target, labels))(z)["x"])
    gt = cfg.tv * np.asarray(jax.grad(total_variation)(jnp.asarray(x)))
    flips = np.sign(gm + gt) != np.sign(gt)
    return {"match_grad_max": float(np.max(np.abs(gm))),
            "match_grad_norm": float(np.linalg.norm(gm)),
            "tv_grad_median": float(np.median(np.abs(gt))),
            "sign_changed_share": float(np.mean(flips))}


def diagnose(result: dict, defenses: list[str]) -> list[dict]:
    """One record per (defense, attacked client of the last round)."""
    import jax
    import jax.numpy as jnp

    import fedsim.data
    from attacks import sgi
    from attacks.gradient_inversion import invert_victims, prepare_victims
    from attacks.labels import observed_gradient
    from benchmarks.reproduce_chu2023 import (b_model, fl_config, part_b_attack_key, score,
                                              sgi_mask_of, train_b, upload_of)
    from fedsim.models import build_model
    from fedsim.observer import restrict

    args = argparse.Namespace(**result["settings"])
    seed, rows, R = result["seed"], result["rows"], args.rounds
    ds = fedsim.data.load_dataset(result.get("dataset", "fashion_mnist"),
                                  image_size=result["image_size"],
                                  seed=0)  # synthetic's seed, as reproduce_chu2023 loads it
    cfg = fl_config(args, seed, R, sorted({0, R // 2, R - 1}))
    n_victims, position = part_b_victims(rows)
    keys = jax.random.split(jax.random.fold_in(part_b_attack_key(seed), 2), n_victims)
    model = build_model(b_model(args), ds.num_classes)
    x_test = jnp.asarray(ds.x_test[:1000])
    out = []
    for name in defenses:
        if name not in args.defenses:
            raise ValueError(f"--defenses: {name!r} is not among the results' part-B defenses "
                             f"{args.defenses}")
        t0 = time.perf_counter()
        run = train_b(args, ds, cfg, name)
        recorded = next(r["accuracy_by_round"] for r in rows
                        if r["part"] == "B" and r["defense"] == name)
        if [float(a) for a in run["acc_by_round"]] != [float(a) for a in recorded]:
            raise RuntimeError(f"{name}: the rebuilt federation's accuracies differ from the "
                               "rows' accuracy_by_round; this code is not the code that wrote "
                               "the results (see their commit)")
        train_s = time.perf_counter() - t0
        up = upload_of(name, args.upload)
        last = [o for o in run["observed"] if o.observation.round == R - 1]
        for o in last:
            ob = restrict(o.observation, {"labels": True, "batch_size": True,
                                          "local_steps": True})
            pos = position[(name, R - 1, ob.client_id)]
            params = ob.params
            rec = {"defense": name, "client_id": ob.client_id, "round": ob.round,
                   "victim_position": pos, "upload": up, "train_seconds": train_s,
                   "accuracy": float(run["acc_by_round"][-1])}
            logits = np.asarray(ob.apply_fn(params, x_test))
            rec["logit_std_over_test_max"] = float(np.max(np.std(logits, axis=0)))
            rec["predicted_classes_test"] = int(len(np.unique(np.argmax(logits, -1))))
            rec["activity_victim"] = unit_activity(model, params, jnp.asarray(o.x))
            rec["activity_test"] = unit_activity(model, params, x_test)
            ce = lambda x: jnp.mean(-jax.nn.log_softmax(ob.apply_fn(params, x))[
                jnp.arange(x.shape[0]), jnp.asarray(o.y)])
            rec["ce_input_grad_norm"] = float(jnp.linalg.norm(jax.grad(ce)(jnp.asarray(o.x))))
            recs = {}
            for att, masked in (("gi", False), ("sgi", True)):
                view = sgi.from_weight_upload(ob) if (masked and up == "weights") else ob
                # SGI as the results ran it (attacks.sgi.run_many): under the `model`
                # rule its mask is read off the client's weights and goes with the
                # target; under `support` (results before the rule) off Δ's zeros.
                by_model = masked and sgi_mask_of(args) == "model"
                acfg, merged = attack_cfg(args.attack_b, masked, mask_in_target=by_model)
                mask = sgi.model_mask(ob) if by_model else None
                target_fn = ((lambda o: {"gradient": observed_gradient(o), "mask": mask})
                             if by_model else observed_gradient)
                bs, _, targets, labels, _, _, _ = prepare_victims(
                    [view], merged, acfg, part_b_attack_key(seed), target_fn)
                # Part B's victims started from different global models, so it ran with
                # a victim axis on the params: keep one here as well.
                stacked = jax.tree_util.tree_map(lambda a: a[None], params)
                res = invert_victims(ob.apply_fn, acfg, stacked, targets, labels, keys[pos][None],
                                     batch_size=bs, input_shape=tuple(ob.input_shape),
                                     num_classes=ob.num_classes, shared_params=False)
                x_rec = res["x"][0]
                n, ps = score(x_rec, o.x)
                row = rows_of(rows, name, R - 1, ob.client_id)[att]
                target = jax.tree_util.tree_map(lambda t: t[0], targets)
                recs[att] = x_rec
                rec[att] = {"nmi": n, "psnr": ps, "loss": float(res["loss"][0]),
                            "row_nmi": row["nmi"], "row_psnr": row["psnr"],
                            "row_loss": row["attack_loss"],
                            "at_reconstruction": sign_steering(
                                ob.apply_fn, acfg, params, target, labels[0], x_rec,
                                ob.num_classes),
                            "at_true_batch": sign_steering(
                                ob.apply_fn, acfg, params, target, labels[0], np.asarray(o.x),
                                ob.num_classes)}
            rec["gi_sgi_max_pixel_difference"] = float(np.max(np.abs(recs["gi"] - recs["sgi"])))
            out.append(rec)
            print(f"[{name}] client {ob.client_id}: acc {rec['accuracy']:.4f}, "
                  f"|x_gi - x_sgi|max {rec['gi_sgi_max_pixel_difference']:.3g}, sign changed "
                  f"by matching: gi {rec['gi']['at_reconstruction']['sign_changed_share']:.3g} "
                  f"sgi {rec['sgi']['at_reconstruction']['sign_changed_share']:.3g}", flush=True)
    return out


def markdown(res: dict) -> str:
    names = [r["defense"] for r in res["records"] if r["defense"] != "none"]
    shown = " / ".join(dict.fromkeys(n.replace("_", " ").capitalize() for n in names)) or "none"
    lines = [f"# Part B's {shown} uploads: why GI and SGI reconstruct the same image",
             "", f"Source: `{res['source']}` (commit {res['source_commit']}); this run: commit "
             f"{res['commit']}, {res['seconds']:.0f} s, {res['device']}. Every federation was "
             "rebuilt (its per-round accuracies equal the rows').", "",
             "Model the server sent in the last round (the attacked one):", "",
             "| defense | client | accuracy | classes predicted (1000 test) | max logit std over "
             "test | units ever active, victim batch (Conv_0 / Conv_1 / Dense_0) | "
             "‖∇ₓ CE‖, victim batch |", "|---|---|---|---|---|---|---|"]
    for r in res["records"]:
        act = " / ".join(f"{r['activity_victim'][k]['units_ever_active']:.3f}" for k in HIDDEN)
        lines.append(f"| {r['defense']} | {r['client_id']} | {r['accuracy']:.4f} | "
                     f"{r['predicted_classes_test']} | {r['logit_std_over_test_max']:.3g} | {act} | "
                     f"{r['ce_input_grad_norm']:.3g} |")
    lines += ["", "Attacks (re-run with the victims' own part-B keys; the row's value in "
              "brackets). 'Sign changed': share of pixels where the matching term changes the "
              "sign of the (signed) step that the TV prior alone would take, at the attack's "
              "reconstruction / at the true batch.", "",
              "| defense | client | attack | NMI [row] | PSNR [row] | loss [row] | max ‖∇ₓ match‖ "
              "at rec. | median ‖tv ∇ₓ TV‖ at rec. | sign changed (rec. / true) | "
              "max GI−SGI pixel difference |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["records"]:
        for att in ("gi", "sgi"):
            a = r[att]
            lines.append(
                f"| {r['defense']} | {r['client_id']} | {att.upper()} | {a['nmi']:.4f} "
                f"[{a['row_nmi']:.4f}] | {a['psnr']:.2f} [{a['row_psnr']:.2f}] | {a['loss']:.3g} "
                f"[{a['row_loss']:.3g}] | {a['at_reconstruction']['match_grad_max']:.3g} | "
                f"{a['at_reconstruction']['tv_grad_median']:.3g} | "
                f"{a['at_reconstruction']['sign_changed_share']:.3g} / "
                f"{a['at_true_batch']['sign_changed_share']:.3g} | "
                f"{r['gi_sgi_max_pixel_difference']:.3g} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS / "chu2023_B.json"),
                    help="a part-B results file of reproduce_chu2023 (default: the committed one)")
    ap.add_argument("--defenses", default="none,largest",
                    help="comma list of the file's part-B defenses to rebuild")
    ap.add_argument("--out", default=str(RESULTS), help="directory for NAME.{json,md}")
    ap.add_argument("--name", default="largest_collapse",
                    help="output file stem (default largest_collapse; e.g. mix_collapse for "
                         "--results chu2023_B_fig4.json --defenses mix)")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9]+(_[A-Za-z0-9]+)*", args.name):
        ap.error(f"--name must be letters, digits and single underscores, got {args.name!r}")
    path = Path(args.results)
    if not path.exists():
        ap.error(f"--results {path}: no such file (run `python -m benchmarks.reproduce_chu2023 "
                 "--quick --parts B` first)")
    from benchmarks.results_file import read_or_exit

    result = read_or_exit(ap, path, "--results")
    if not any(r.get("part") == "B" for r in result.get("rows", [])):
        ap.error(f"--results {path}: no part-B rows")
    import jax

    from benchmarks.provenance import git_commit
    commit, t0 = git_commit(), time.perf_counter()
    try:
        records = diagnose(result, [d for d in args.defenses.split(",") if d])
    except (ValueError, RuntimeError) as e:
        ap.error(str(e))
    res = {"source": path.name, "source_commit": result.get("commit"), "commit": commit,
           "command": "python benchmarks/diagnose_largest_collapse.py "
                      + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": f"{jax.default_backend()} ({platform.processor() or platform.machine()})",
           "seconds": time.perf_counter() - t0, "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(res, indent=1, default=float))
    (out / f"{args.name}.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
