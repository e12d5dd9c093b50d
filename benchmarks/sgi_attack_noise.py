"""How much of an SGI/GI PSNR difference is the attack's own noise? (issue #7)

``diagnose_sgi_p_trend.py`` (its *final* states) and ``reproduce_chu2023.py --parts A
--a-trained-rounds 30`` attack the same trained models and victims when both draw
their keys from part A's named streams: same initial model, masks, training and
victim batches, but other attack keys. So the difference between their 3-victim mean
PSNRs is the attack's run-to-run noise at one restart. This script reads the two
committed results, checks that the models are the same (the same victims and the
same test accuracy to 1e-6), and tabulates the differences.

Usage: ``python benchmarks/sgi_attack_noise.py`` → ``benchmarks/results/sgi_attack_noise.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, too

from benchmarks.results_file import read_or_exit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def paired_states(trend: dict, trained: dict) -> list[dict]:
    """The (scheme, p) states both runs attacked, with both runs' mean PSNRs.

    Raises:
        ValueError: the runs attacked different victims or differently trained models
            (not the same keys), or share no state.
    """
    rows = {(r["base"], r["p"], r["attack"]): r for r in trained["rows"]
            if r["model"] == "conv2" and r["B"] == trend["settings"]["batch"]}
    pairs = []
    for st in trend["states"]:
        if st["state"] != "final" or (st["scheme"], st["p"], "sgi") not in rows:
            continue
        sgi, gi = rows[(st["scheme"], st["p"], "sgi")], rows[(st["scheme"], st["p"], "gi")]
        if sgi["victim_indices"] != trend["victim_indices"]:
            raise ValueError(f"{st['scheme']} p={st['p']}: the two runs attacked different "
                             "victims; re-run both at the same seed and key streams")
        if abs(sgi["trained_accuracy"] - st["accuracy"]) > 1e-6:
            raise ValueError(f"{st['scheme']} p={st['p']}: trained accuracy "
                             f"{sgi['trained_accuracy']:.6f} vs {st['accuracy']:.6f}: not the "
                             "same model; re-run both at the same seed and key streams")
        pairs.append({"scheme": st["scheme"], "p": st["p"], "accuracy": st["accuracy"],
                      "sgi_trend": st["sgi_psnr"], "sgi_trained": sgi["psnr"],
                      "gi_trend": st["gi_psnr"], "gi_trained": gi["psnr"]})
    if not pairs:
        raise ValueError("the two results share no (scheme, p) state")
    return pairs


def markdown(pairs: list[dict], trend: dict, trained: dict) -> str:
    lines = ["# Attack noise: the same models and victims, other attack keys", "",
             f"`sgi_p_trend.json` (commit {trend['commit']}) final states against "
             f"`chu2023_A_trained30.json` (commit {trained['commit']}); 3-victim mean PSNR "
             "(dB), 1 restart. Produced by `python benchmarks/sgi_attack_noise.py`.", "",
             "| scheme | p | test acc | SGI (diagnostic) | SGI (part A) | abs. diff. "
             "| GI (diagnostic) | GI (part A) | abs. diff. |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in pairs:
        lines.append(f"| {r['scheme']} | {r['p']} | {r['accuracy']:.4f} | {r['sgi_trend']:.2f} | "
                     f"{r['sgi_trained']:.2f} | {abs(r['sgi_trend'] - r['sgi_trained']):.2f} | "
                     f"{r['gi_trend']:.2f} | {r['gi_trained']:.2f} | "
                     f"{abs(r['gi_trend'] - r['gi_trained']):.2f} |")
    ds = [abs(r["sgi_trend"] - r["sgi_trained"]) for r in pairs]
    dg = [abs(r["gi_trend"] - r["gi_trained"]) for r in pairs]
    lines += ["", f"Absolute difference, SGI: {min(ds):.1f}–{max(ds):.1f} dB; "
              f"GI: {min(dg):.1f}–{max(dg):.1f} dB ({len(pairs)} states)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS), help="folder of the two JSONs")
    args = ap.parse_args(argv)
    folder = Path(args.results)
    files = [folder / "sgi_p_trend.json", folder / "chu2023_A_trained30.json"]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        ap.error(f"missing {', '.join(missing)}: run benchmarks/diagnose_sgi_p_trend.py and "
                 "benchmarks/reproduce_chu2023.py --quick --parts A --a-trained-rounds 30")
    trend, trained = (read_or_exit(ap, f, "--results") for f in files)
    try:
        pairs = paired_states(trend, trained)
    except ValueError as e:
        ap.error(str(e))
    md = markdown(pairs, trend, trained)
    (folder / "sgi_attack_noise.md").write_text(md)
    print(md)


if __name__ == "__main__":
    sys.exit(main())
