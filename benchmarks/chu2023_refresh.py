"""Part A with some schemes' rows refreshed: what a fix to a scheme moves (issue #7).

A fix to one base scheme (b6b3645: FedDST at p = 0.1 pruned 18 % before it) leaves
every part-A run made before it stale on that scheme's rows only. Rerunning part A
whole takes about an hour per seed here; ``reproduce_chu2023 --parts A --schemes S
--tag T`` reruns the p axis of S alone, with the initial model, the victims and the
mask key streams a whole run draws (its p-axis group comes first either way).

This script pairs each whole run (``--base``) with its refresh (``--refresh``, same
order: same seed, protocol and settings but the scheme list), puts the refresh's rows
in place of the base's for the refreshed schemes, and reports, old beside new:

* per refreshed (scheme, p): the pruned share of the victims' gradients, GI and SGI
  PSNR / NMI (victim means), and SGI − GI in PSNR paired over the victims;
* per refreshed scheme: the per-victim slopes over p (``p_trend``);
* part A's acceptance checks (``reproduce_chu2023.acceptance_checks``) on the base run
  and on the base run with the refreshed rows, and which verdicts moved;
* over the pairs (two or more, one protocol): SGI − GI with the victims pooled
  (``sgi_gi_pooled``) and the per-victim slopes over p (``p_trend_pooled``) of the
  refreshed schemes.

Every check and table of part A is per (scheme, p) or per scheme, so a replaced row
enters only its own scheme's verdicts (and the counts of how many hold). The
refreshed rows are not what a whole rerun would give to the bit: both attacks draw
their random starts from the p-axis group's attack key split over the group's
settings, and the refresh's group has fewer of them. Victims, initial model and masks
are the same, and checked: a refresh whose victims or key-stream names differ from
the base's is refused.

The refresh must be run with the base run's settings: runs made before an option
existed recorded none for it and read as its value then (``reproduce_chu2023``'s
``_SETTING_DEFAULTS``), so a refresh of the committed part-A runs (before Nov 27 2026)
passes ``--sgi-mask support --observer-fill sorted_cut --pseudo-start kept``; a
difference is named.

Usage::

    python -m benchmarks.chu2023_refresh \\
        --base chu2023_A_alg1.json,chu2023_A_alg1_seed1.json,chu2023_A_alg1_seed2.json \\
        --refresh chu2023_A_alg1_feddst.json,chu2023_A_alg1_seed1_feddst.json,\\
chu2023_A_alg1_seed2_feddst.json \\
        --stem chu2023_A_alg1_feddst_refresh

→ ``benchmarks/results/<stem>.{json,md}`` (files are read from ``--results``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, too

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_file import ResultsFileError, read_results_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _schemes(result: dict) -> list[str]:
    from defenses.pruning.schemes import SCHEMES
    return list(result.get("settings", {}).get("schemes", SCHEMES))


def check_pair(base: dict, refresh: dict) -> list[str]:
    """The refreshed schemes of ``refresh``, after checking it is ``base``'s refresh.

    Raises:
        ValueError: ``base`` is not a whole p axis, ``refresh`` is, their seeds or other
            settings differ, or the refreshed rows attack other victims or name other
            key streams than the base's rows of the same (scheme, p).
    """
    from benchmarks.reproduce_chu2023 import settings_diff
    from defenses.pruning.schemes import SCHEMES

    if _schemes(base) != list(SCHEMES):
        raise ValueError(f"the base run has schemes {_schemes(base)}, not the whole p axis")
    schemes = _schemes(refresh)
    if schemes == list(SCHEMES):
        raise ValueError("the refresh is a whole p axis (no --schemes): compare whole runs "
                         "with compare_chu2023_runs")
    if base.get("seed") != refresh.get("seed"):
        raise ValueError(f"seeds differ: base {base.get('seed')}, refresh {refresh.get('seed')}")
    diff = [(k, v, w) for k, v, w in settings_diff(refresh.get("settings", {}),
                                                  base.get("settings", {}),
                                                  skip_extra=("schemes",))]
    diff += [(k, refresh.get(k), base.get(k)) for k in ("mode", "image_size", "dataset",
                                                        "partition")
             if refresh.get(k) != base.get(k)]
    if diff:
        raise ValueError("settings differ (refresh vs base): "
                         + ", ".join(f"{k} ({v!r} vs {w!r})" for k, v, w in diff))
    old = {(r["base"], r["p"], r["B"], r["model"], r["attack"]): r
           for r in base["rows"] if r["part"] == "A" and r["base"] in schemes}
    new = {(r["base"], r["p"], r["B"], r["model"], r["attack"]): r
           for r in refresh["rows"] if r["part"] == "A"}
    if set(old) != set(new):
        raise ValueError(f"the refresh's settings of {', '.join(schemes)} are not the base's: "
                         f"{len(set(old) - set(new))} only in the base, "
                         f"{len(set(new) - set(old))} only in the refresh")
    for k, r in new.items():
        for field in ("victim_indices", "init_key", "mask_key"):
            if r.get(field) != old[k].get(field):
                raise ValueError(f"{k[0]} p={k[1]} B={k[2]} {k[4]}: the refresh's {field} is "
                                 "not the base's (another draw: not a refresh of this run)")
    return schemes


def refreshed_rows(base: dict, refresh: dict, schemes: list[str]) -> list[dict]:
    """``base``'s rows with those of ``schemes`` replaced by ``refresh``'s (part A)."""
    keep = [r for r in base["rows"] if not (r["part"] == "A" and r["base"] in schemes)]
    return keep + [r for r in refresh["rows"] if r["part"] == "A"]


def setting_table(base: dict, refresh: dict, schemes: list[str]) -> list[dict]:
    """Per refreshed p-axis (scheme, p): old and new pruned share, PSNR / NMI means and
    SGI − GI paired over victims."""
    from benchmarks.reproduce_chu2023 import sgi_gi_paired

    def per(rows):
        paired = {(x["base"], x["p"]): x for x in sgi_gi_paired(
            [r for r in rows if r["part"] == "A"])}
        out = {}
        for (scheme, p), x in paired.items():
            if scheme not in schemes:
                continue
            by = {r["attack"]: r for r in rows if r["part"] == "A" and r["base"] == scheme
                  and r["p"] == p and r["B"] == x["B"] and r["model"] == "conv2"}
            share = by["sgi"].get("pruned_grad_share_victims")
            out[(scheme, p)] = {"pruned_grad_share": None if share is None
                                else float(np.mean(share)),
                                "pruned_grad_share_victims": share,
                                "gi_psnr": x["gi_psnr"], "sgi_psnr": x["sgi_psnr"],
                                "gi_nmi": by["gi"]["nmi"], "sgi_nmi": by["sgi"]["nmi"],
                                "sgi_minus_gi": {k: x[k] for k in ("diffs", "mean", "ci",
                                                                   "verdict")}}
        return out

    old, new = per(base["rows"]), per(refresh["rows"])
    for name, table in (("base", old), ("refresh", new)):
        if not table:
            raise ValueError(f"the {name} run's p-axis rows of {', '.join(schemes)} carry no "
                             "per-victim PSNR / NMI (runs made before they were recorded): "
                             "nothing to pair")
    return [{"scheme": s, "p": p, "old": old[(s, p)], "new": new[(s, p)],
             "masks": same_masks(old[(s, p)]["pruned_grad_share_victims"],
                                 new[(s, p)]["pruned_grad_share_victims"])}
            for s, p in sorted(new)]


def same_masks(old_shares, new_shares) -> str:
    """"same" where both runs record the victims' pruned gradient shares and they agree
    (the same model and mask give the same shares), "other" where they differ (the
    scheme's mask changed: the fix, or an older way of drawing it), "unverified" where
    a run records none (runs before the shares were recorded)."""
    if old_shares is None or new_shares is None:
        return "unverified"
    same = len(old_shares) == len(new_shares) and np.allclose(old_shares, new_shares,
                                                              rtol=1e-4, atol=1e-7)
    return "same" if same else "other"


def trend_table(base: dict, refresh: dict, schemes: list[str]) -> dict:
    """``p_trend`` of the refreshed schemes on the old and the new rows of one pair."""
    from benchmarks.reproduce_chu2023 import p_trend

    of = lambda rows: [x for x in p_trend([r for r in rows if r["part"] == "A"])  # noqa: E731
                       if x["base"] in schemes]
    return {"old": of(base["rows"]), "new": of(refresh["rows"])}


def compare_checks(old_rows: list[dict], new_rows: list[dict]) -> list[dict]:
    """Part A's acceptance checks on the old and the refreshed rows, side by side."""
    from benchmarks.reproduce_chu2023 import acceptance_checks

    part_a = lambda rows: acceptance_checks([r for r in rows if r["part"] == "A"])  # noqa: E731
    return [{"check": o["check"], "old": o["pass"], "new": n["pass"], "old_detail": o["detail"],
             "new_detail": n["detail"]}
            for o, n in zip(part_a(old_rows), part_a(new_rows), strict=True)]


def pooled(pairs: list[tuple[dict, list[dict]]], schemes: list[str]) -> dict:
    """SGI − GI and the slopes over p of ``schemes``, pooled over the pairs' seeds, for the
    old rows and the refreshed ones."""
    from benchmarks.reproduce_chu2023 import p_trend, p_trend_pooled, sgi_gi_paired, sgi_gi_pooled

    out = {}
    for label, runs in (("old", [b["rows"] for b, _ in pairs]), ("new", [r for _, r in pairs])):
        a = [[r for r in rows if r["part"] == "A"] for rows in runs]
        out[label] = {
            "sgi_minus_gi_psnr": [x for x in sgi_gi_pooled([sgi_gi_paired(x) for x in a])
                                  if x["base"] in schemes],
            "p_trend": [x for x in p_trend_pooled([p_trend(x) for x in a])
                        if x["base"] in schemes]}
    return out


def analyse(bases: list[dict], refreshes: list[dict], names: list[tuple[str, str]]) -> dict:
    """The report of the ``(base, refresh)`` pairs (see the module docstring).

    Raises:
        ValueError: a pair is not a run and its refresh (:func:`check_pair`), the pairs
            refresh other schemes, or they mix protocols.
    """
    out_pairs, merged, schemes = [], [], None
    protocols = {(b.get("settings", {}).get("a_protocol", "pruned_model"),
                  b.get("settings", {}).get("a_trained_rounds", 0)) for b in bases}
    if len(protocols) > 1:
        raise ValueError(f"the base runs mix part-A protocols {sorted(protocols)}: one at a time")
    for (bn, rn), b, r in zip(names, bases, refreshes, strict=True):
        try:
            s = check_pair(b, r)
        except ValueError as e:
            raise ValueError(f"{rn} against {bn}: {e}") from None
        if schemes is not None and s != schemes:
            raise ValueError(f"{rn} refreshes {s}, the first refresh {schemes}")
        schemes = s
        rows = refreshed_rows(b, r, s)
        merged.append((b, rows))
        out_pairs.append({"base": bn, "refresh": rn, "seed": b.get("seed"),
                          "base_commit": b.get("commit"), "refresh_commit": r.get("commit"),
                          "settings": setting_table(b, r, s),
                          "p_trend": trend_table(b, r, s),
                          "checks": compare_checks(b["rows"], rows)})
    return {"schemes": schemes, "protocol": sorted(protocols)[0][0], "pairs": out_pairs,
            "pooled": pooled(merged, schemes) if len(merged) >= 2 else None}


def _ci(x: dict) -> str:
    lo, hi = x["ci"]
    return f"{x['mean']:+.2f} ({lo:+.2f} to {hi:+.2f}) {x['verdict']}"


def markdown(report: dict) -> str:
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    lines = [f"# Part A ({report['protocol']}) with {', '.join(report['schemes'])} refreshed",
             "", f"Produced by `python -m benchmarks.chu2023_refresh {' '.join(report['argv'])}`"
             f" at {short_commit(report['commit'])}. Each base run's rows of "
             f"{', '.join(report['schemes'])} are replaced by its refresh's (same seed, "
             "initial model, victims and mask key-stream names, checked; the attacks' "
             "random starts differ, see the script's docstring); every other row is the "
             "base run's. Masks: 'same' where both runs' recorded pruned shares of the "
             "victims' gradients agree, 'other' where they differ (the mask changed), "
             "'unverified' where the base run records none. SGI − GI: mean over victims "
             "(95 % t interval) and its verdict.", ""]
    for pair in report["pairs"]:
        lines += [f"## Seed {pair['seed']}: {pair['refresh']} in {pair['base']}", "",
                  f"Commits: base {short_commit(str(pair['base_commit']))}, refresh "
                  f"{short_commit(str(pair['refresh_commit']))}.", "",
                  "| scheme | p | pruned share old → new | masks | GI PSNR old → new | "
                  "SGI PSNR old → new | SGI NMI old → new | SGI − GI old | SGI − GI new |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for x in pair["settings"]:
            o, n = x["old"], x["new"]
            share = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"| {x['scheme']} | {x['p']:g} | {share(o['pruned_grad_share'])} → "
                         f"{share(n['pruned_grad_share'])} | {x['masks']} | "
                         f"{o['gi_psnr']:.2f} → "
                         f"{n['gi_psnr']:.2f} | {o['sgi_psnr']:.2f} → {n['sgi_psnr']:.2f} | "
                         f"{o['sgi_nmi']:.3f} → {n['sgi_nmi']:.3f} | "
                         f"{_ci(o['sgi_minus_gi'])} | {_ci(n['sgi_minus_gi'])} |")
        lines += ["", "Slopes over p (per unit p; NMI, or dB for PSNR), mean over the victims "
                  "(95 % t interval) and its verdict.", "",
                  "| scheme | attack | metric | old | new |", "|---|---|---|---|---|"]
        for o, n in zip(pair["p_trend"]["old"], pair["p_trend"]["new"], strict=True):
            lines.append(f"| {o['base']} | {o['attack'].upper()} | {o['metric'].upper()} | "
                         f"{_ci(o)} | {_ci(n)} |")
        moved = [c for c in pair["checks"] if c["old"] != c["new"]]
        lines += ["", "| part-A check | base | with the refresh |", "|---|---|---|"]
        lines += [f"| {c['check']} | {verdict(c['old'])}: {c['old_detail']} | "
                  f"{verdict(c['new'])}: {c['new_detail']} |" for c in pair["checks"]]
        lines += ["", f"Verdicts that moved: {len(moved)} of {len(pair['checks'])}.", ""]
    if report["pooled"]:
        seeds = ", ".join(str(p["seed"]) for p in report["pairs"])
        lines += [f"## Pooled over seeds {seeds}", "",
                  "SGI − GI in PSNR with the victims of every seed pooled (last column: the "
                  "seeds' means as the replicates).", "",
                  "| scheme | p | rows | GI PSNR | SGI PSNR | SGI − GI, victims pooled | "
                  "seeds as replicates |", "|---|---|---|---|---|---|---|"]
        for label in ("old", "new"):
            for x in report["pooled"][label]["sgi_minus_gi_psnr"]:
                lo, hi = x["seed_ci"]
                lines.append(f"| {x['base']} | {x['p']:g} | {label} | {x['gi_psnr']:.2f} | "
                             f"{x['sgi_psnr']:.2f} | {_ci(x)} | ({lo:+.2f} to {hi:+.2f}) "
                             f"{x['seed_verdict']} |")
        lines += ["", "Slopes over p (per unit p; NMI, or dB for PSNR), victims pooled "
                  "(last column: the seeds' mean slopes as the replicates).", "",
                  "| scheme | attack | metric | rows | slope, victims pooled | "
                  "seeds as replicates |", "|---|---|---|---|---|---|"]
        for label in ("old", "new"):
            for x in report["pooled"][label]["p_trend"]:
                lo, hi = x["seed_ci"]
                lines.append(f"| {x['base']} | {x['attack'].upper()} | {x['metric'].upper()} | "
                             f"{label} | {_ci(x)} | ({lo:+.3g} to {hi:+.3g}) "
                             f"{x['seed_verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True,
                    help="comma list of whole part-A results files (one per seed)")
    ap.add_argument("--refresh", required=True,
                    help="comma list of their refreshes (reproduce_chu2023 --schemes), in the "
                         "same order")
    ap.add_argument("--results", default=str(RESULTS), help="folder the files are read from")
    ap.add_argument("--stem", default=None,
                    help="write <out>/<stem>.{json,md} (default: print the markdown only)")
    ap.add_argument("--out", default=str(RESULTS), help="folder of --stem's files")
    args = ap.parse_args(argv)
    commit = git_commit()  # at start: the code this process loaded
    names = {o: [n.strip() for n in getattr(args, o).split(",") if n.strip()]
             for o in ("base", "refresh")}
    if len(names["base"]) != len(names["refresh"]) or not names["base"]:
        ap.error(f"--base names {len(names['base'])} file(s) and --refresh "
                 f"{len(names['refresh'])}: give one refresh per base run, in the same order")
    loaded = {}
    for option, files in names.items():
        try:
            loaded[option] = [read_results_json(Path(args.results) / f, f"--{option}")
                              for f in files]
        except ResultsFileError as e:
            ap.error(str(e))
        for f, r in zip(files, loaded[option]):
            if not isinstance(r.get("rows"), list):
                ap.error(f"--{option} {f}: no 'rows': not a reproduce_chu2023 results file")
    try:
        report = analyse(loaded["base"], loaded["refresh"],
                         list(zip(names["base"], names["refresh"])))
    except (KeyError, ValueError) as e:
        ap.error(str(e))
    report = {"commit": commit, "argv": list(argv if argv is not None else sys.argv[1:]),
              **report}
    md = markdown(report)
    if args.stem:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.stem}.json").write_text(json.dumps(report, indent=1, default=float))
        (out / f"{args.stem}.md").write_text(md)
    print(md)
    return report


if __name__ == "__main__":
    main()
