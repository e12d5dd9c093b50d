"""Where does GI beat SGI? The pruned share of the victims' gradient (issue #7).

SGI (Alg 2) differs from GI only in the coordinates it leaves out: the pruned ones.
GI keeps them as targets — 0 when the upload is a pruned model's FedSGD update
(part A's default protocol), −w when the victim prunes its trained dense model and
uploads weights (``--a-protocol alg1``, the paper's Alg 1). Leaving them out helps
SGI when those targets are wrong, and costs it information when they are nearly
right. How wrong a 0 target is depends on how much of the victim's true gradient
lies on the pruned coordinates:

    share = ‖g ⊙ (1 − m)‖² / ‖g‖²   (mean over the setting's victims),

about p for Random, far less for schemes that prune low-saliency weights (SNIP,
SynFlow). This script recomputes the share for the committed part-A rows
(``chu2023_A.json``: Conv-2, the p axis, at the initial model) with part A's own
key streams and victims, puts it beside each setting's SGI − GI PSNR gap, and does
the same for ``chu2023_A_alg1.json`` where present (whose rows record the share at
the dense model and the size of GI's −w targets). It checks that it rebuilt part A's
models: the key-stream names must match the rows', and under Alg 1 the recomputed
shares must equal the recorded ones.

No attack runs here; the SynFlow/GraSP masks and the compiles take a few minutes on
2 CPU cores (4–6 min here, beside other jobs).

Usage: ``python benchmarks/diagnose_sgi_vs_gi.py`` → ``benchmarks/results/sgi_vs_gi.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, too
from benchmarks.provenance import git_commit, short_commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def p_axis(rows: list[dict], batch: int | None = None) -> dict:
    """{(scheme, p): {"gi": row, "sgi": row}} of part A's p axis: Conv-2 at ``batch``
    (the run's ``p_axis_batch`` setting), or where that is not given at the batch size
    ``reproduce_chu2023.rows_p_axis_batch`` reads off the rows."""
    from benchmarks.reproduce_chu2023 import rows_p_axis_batch

    a = [r for r in rows if r["part"] == "A"]
    if not a:
        raise ValueError("no part-A rows")
    if batch is None:
        bp = rows_p_axis_batch(a)
    else:
        random_b = {r["B"] for r in a if r["base"] == "random"}  # on the p axis only
        if random_b - {batch}:
            raise ValueError(f"the rows' Random pruning ran at B = {sorted(random_b)}, not at "
                             f"the recorded p_axis_batch {batch}")
        bp = batch
    if bp is None:
        raise ValueError("no Conv-2 rows: no p axis")
    out: dict = {}
    for r in a:
        if r["model"] == "conv2" and r["B"] == bp:
            out.setdefault((r["base"], r["p"]), {})[r["attack"]] = r
    return out


def p_axis_of(result: dict) -> dict:
    """:func:`p_axis` of a part-A result, at the batch its settings record (a run of some
    schemes only, ``reproduce_chu2023 --schemes``, may have no Random rows)."""
    return p_axis(result["rows"], result.get("settings", {}).get("p_axis_batch"))


def rebuild(result: dict, protocol: str, only=None):
    """Yield ``(scheme, p, observations, true images, stats)`` of part A's p-axis settings,
    rebuilt from the key streams and victims the rows name (``only``: one (scheme, p)).
    The model is part A's initial Conv-2, pruned under "pruned_model", dense under "alg1".

    Raises:
        ValueError: the rows' key-stream names are not part A's current ones.
    """
    import jax
    import jax.numpy as jnp

    import fedsim.data
    from benchmarks.reproduce_chu2023 import part_a_key, scheme_mask, victim_observations
    from defenses.pruning import apply_mask
    from fedsim.models import build_model, init_params, make_apply_fn

    seed = result["seed"]
    ds = fedsim.data.load_dataset(result.get("dataset", "fashion_mnist"),
                                  image_size=result["image_size"],
                                  seed=0)  # synthetic's seed, as reproduce_chu2023 loads it
    rng = np.random.default_rng(seed)  # part A's first draw: the server's probe batch
    probe = rng.choice(len(ds.y_train), 64, replace=False)
    xp, yp = jnp.asarray(ds.x_train[probe]), jnp.asarray(ds.y_train[probe])
    model = build_model("conv2", ds.num_classes)
    apply_fn = make_apply_fn(model)
    init_key, init_name = part_a_key(seed, "init", "conv2")
    params = init_params(model, ds.input_shape, init_key)
    its = result["settings"]["synflow_iterations"]
    for (scheme, p), pair in sorted(p_axis_of(result).items()):
        if only is not None and (scheme, p) != tuple(only):
            continue
        row = pair["sgi"]
        mask_key, mask_name = part_a_key(seed, "mask", "conv2", scheme, p)
        if (row.get("init_key"), row.get("mask_key")) != (init_name, mask_name):
            raise ValueError(f"{scheme} p={p}: the rows' key streams "
                             f"({row.get('init_key')}, {row.get('mask_key')}) are not part A's "
                             f"current ones ({init_name}, {mask_name}); re-run part A")
        mask = scheme_mask(scheme, mask_key, params, p, apply_fn, xp, yp, ds.input_shape, its)
        model_params = params if protocol == "alg1" else apply_mask(params, mask)
        victims = [np.asarray(v) for v in row["victim_indices"]]
        obs, truths, stats = victim_observations(apply_fn, model_params, mask, ds, victims,
                                                 0.25, protocol)
        yield scheme, p, obs, truths, stats
        jax.clear_caches()


def recompute_shares(result: dict, protocol: str) -> dict:
    """The pruned share of each p-axis setting's victims' gradients, per victim."""
    return {(scheme, p): [s["pruned_grad_share"] for s in stats]
            for scheme, p, _, _, stats in rebuild(result, protocol)}


def table(result: dict, shares: dict) -> list[dict]:
    """One entry per p-axis setting: share, the SGI − GI gaps and the recorded diagnostics."""
    out = []
    for (scheme, p), pair in sorted(p_axis_of(result).items()):
        g, s = pair["gi"], pair["sgi"]
        entry = {"scheme": scheme, "p": p, "pruned_grad_share": float(np.mean(shares[(scheme, p)])),
                 "pruned_grad_share_victims": shares[(scheme, p)],
                 "sgi_minus_gi_psnr": s["psnr"] - g["psnr"],
                 "sgi_minus_gi_nmi": s["nmi"] - g["nmi"],
                 "sgi_psnr": s["psnr"], "gi_psnr": g["psnr"]}
        if s.get("pruned_weight_ratio_victims"):
            entry["pruned_weight_ratio"] = float(np.mean(s["pruned_weight_ratio_victims"]))
        out.append(entry)
    return out


def check_recorded(result: dict, shares: dict, tol: float = 1e-4) -> None:
    """Raise unless the recomputed shares equal the ones the rows recorded (same models);
    settings absent from ``shares`` are not compared."""
    for (scheme, p), pair in p_axis_of(result).items():
        rec = pair["sgi"].get("pruned_grad_share_victims")
        if rec is None or (scheme, p) not in shares:
            continue
        if not np.allclose(rec, shares[(scheme, p)], rtol=tol, atol=1e-7):
            raise ValueError(f"{scheme} p={p}: recomputed pruned shares {shares[(scheme, p)]} "
                             f"differ from the recorded {rec}: not part A's models")


def summary(entries: list[dict]) -> dict:
    """Spearman's ρ between share and the SGI − GI PSNR gap, and where GI wins, over the
    settings where at least one attack exceeds 10 dB (below, both are flat images)."""
    from scipy.stats import spearmanr
    ok = [e for e in entries if e["gi_psnr"] > 10.0 or e["sgi_psnr"] > 10.0]
    rho, pval = (spearmanr([e["pruned_grad_share"] for e in ok],
                           [e["sgi_minus_gi_psnr"] for e in ok]) if len(ok) >= 3
                 else (float("nan"), float("nan")))
    gi_wins = [e for e in ok if e["sgi_minus_gi_psnr"] < 0]
    sgi_wins = [e for e in ok if e["sgi_minus_gi_psnr"] >= 0]
    return {"spearman_rho": float(rho), "spearman_p": float(pval), "n": len(ok),
            "excluded_both_flat": [f"{e['scheme']}/p={e['p']}" for e in entries if e not in ok],
            "gi_wins": [f"{e['scheme']}/p={e['p']}" for e in gi_wins],
            "max_share_where_gi_wins": max((e["pruned_grad_share"] for e in gi_wins),
                                           default=None),
            "min_share_where_sgi_wins": min((e["pruned_grad_share"] for e in sgi_wins),
                                            default=None)}


def markdown(parts: list[dict], commit: str) -> str:
    from benchmarks.reproduce_chu2023 import share_text
    lines = ["# Where GI beats SGI: the pruned share of the victims' gradient", "",
             "share = ‖g ⊙ (1 − m)‖² / ‖g‖², g the victim's gradient at the model it was "
             "computed on, mean over the setting's victims: the part of the gradient that SGI "
             "leaves out and GI is told is 0 (pruned-model uploads) or −w (Alg 1 weight "
             "uploads). Gaps are 3-victim mean PSNR, 1 restart; the attack's own noise on a "
             "3-victim mean is 0.4–2.9 dB for SGI, 0.0–1.5 dB for GI (`sgi_attack_noise.md`). "
             "Spearman's ρ over the settings where at least one attack exceeds 10 dB (the "
             "others are flat reconstructions for both). Produced by "
             f"`python benchmarks/diagnose_sgi_vs_gi.py` at commit {short_commit(commit)}.", ""]
    for part in parts:
        alg1 = part["protocol"] == "alg1"
        lines += [f"## {part['file']} (commit {part['commit']}; "
                  + ("Alg 1 weight uploads: the dense model's gradient, GI's targets −w)"
                     if alg1 else "pruned-model FedSGD uploads: GI's targets 0)"), "",
                  "| scheme | p | share | SGI − GI PSNR (dB) | SGI − GI NMI |"
                  + (" ‖w ⊙ (1−m)‖ / ‖lr·g ⊙ m‖ |" if alg1 else ""),
                  "|---|---|---|---|---|" + ("---|" if alg1 else "")]
        for e in part["entries"]:
            lines.append(f"| {e['scheme']} | {e['p']} | {share_text(e['pruned_grad_share'])} | "
                         f"{e['sgi_minus_gi_psnr']:+.2f} | {e['sgi_minus_gi_nmi']:+.4f} |"
                         + (f" {e['pruned_weight_ratio']:.1f} |" if alg1 else ""))
        s = part["summary"]
        lines += ["", f"Spearman ρ(share, SGI − GI PSNR) = {s['spearman_rho']:+.2f} "
                  f"(p = {s['spearman_p']:.3f}, n = {s['n']}; left out, both flat: "
                  f"{', '.join(s['excluded_both_flat']) or 'none'}). GI wins at: "
                  f"{', '.join(s['gi_wins']) or 'none'}"
                  + (f" (largest share among them {share_text(s['max_share_where_gi_wins'])}; "
                     f"smallest share where SGI wins {share_text(s['min_share_where_sgi_wins'])})"
                     if s["gi_wins"] and s["min_share_where_sgi_wins"] is not None else "")
                  + ".", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS),
                    help="folder holding chu2023_A.json (and chu2023_A_alg1.json)")
    ap.add_argument("--out", default=str(RESULTS), help="where to write sgi_vs_gi.{json,md}")
    args = ap.parse_args(argv)
    commit = git_commit()  # at start: the code this process loaded
    res_dir, out = Path(args.results), Path(args.out)
    base = res_dir / "chu2023_A.json"
    if not base.exists():
        ap.error(f"--results {res_dir}: no chu2023_A.json (run reproduce_chu2023.py --quick "
                 "--parts A first)")
    parts = []
    for path, protocol in ((base, "pruned_model"), (res_dir / "chu2023_A_alg1.json", "alg1")):
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        if result["settings"].get("a_trained_rounds"):
            ap.error(f"{path.name}: a trained part A; this diagnostic rebuilds initial models")
        try:
            shares = recompute_shares(result, protocol)
            check_recorded(result, shares)
        except ValueError as e:
            print(f"error: {path.name}: {e}", file=sys.stderr)
            raise SystemExit(2)
        entries = table(result, shares)
        parts.append({"file": path.name, "commit": result.get("commit"), "protocol": protocol,
                      "seed": result["seed"], "entries": entries, "summary": summary(entries)})
    out.mkdir(parents=True, exist_ok=True)
    (out / "sgi_vs_gi.json").write_text(json.dumps({"commit": commit, "parts": parts}, indent=1,
                                                        default=float))
    md = markdown(parts, commit)
    (out / "sgi_vs_gi.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
