"""Part B of the chu2023 reproduction read against NMI's unrelated-image floor.

The issue's headline is PriPrune's relative SGI NMI gain over PruneFL alone,
(NMI_none − NMI_priprune) / NMI_none. At part B's batch (B = 20, 16×16) an
attack that recovers nothing about the client but outputs real images of the
dataset already scores NMI ≈ 0.48 (``benchmarks/results/nmi_chance_floor.md``),
so that ratio is measured from 0 while the attacks move above a floor near
0.48. This sets three readings of the same rows side by side:

* the paper's: (NMI_none − NMI_priprune) / NMI_none;
* above the floor: (NMI_none − NMI_priprune) / (NMI_none − floor), the share of
  the leakage above what unrelated images score that PriPrune removes (> 1 when
  PriPrune's attack scores below the floor);
* in AMI (chance-adjusted, ``attacks.metrics.ami``): (AMI_none − AMI_priprune) /
  AMI_none; needs a run that recorded ``ami`` (``reproduce_chu2023`` since
  2026-11-27).

Usage: ``python -m benchmarks.chu2023_floor_reading RUN.json [--floor
benchmarks/results/nmi_chance_floor.json] --out DIR/NAME`` (writes NAME.json
and NAME.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.provenance import git_commit, short_commit  # noqa: E402
from benchmarks.results_io import write_json_and_markdown  # noqa: E402

FLOOR = ROOT / "benchmarks" / "results" / "nmi_chance_floor.json"


def unrelated_floor(floor: dict, image_size: int, batch: int) -> dict:
    """The ``unrelated`` row of the floor file at (image size, B).

    Raises:
      ValueError: the floor file has no such row (names what it has).
    """
    for r in floor["rows"]:
        if (r["image_size"], r["B"], r["reconstruction"]) == (image_size, batch, "unrelated"):
            return r
    have = sorted({(r["image_size"], r["B"]) for r in floor["rows"]})
    raise ValueError(f"the floor file has no 'unrelated' row at {image_size}×{image_size}, "
                     f"B = {batch}; it has (image size, B) {have}")


def readings(run: dict, floor: dict) -> dict:
    """Per defense and attack at part B's last round: mean NMI, AMI, PSNR over the
    observed clients, and PriPrune's gain over PruneFL alone in the three readings."""
    rows = [r for r in run["rows"] if r["part"] == "B"]
    if not rows:
        return {"last_round": None, "floor": None, "means": {}, "priprune_gain": {}}
    last = max(r["round"] for r in rows)
    batches = {r["B"] for r in rows}
    if len(batches) != 1:
        raise ValueError(f"part-B rows at several batch sizes {sorted(batches)}")
    f = unrelated_floor(floor, int(run["image_size"]), batches.pop())
    table = {}
    for r in rows:
        if r["round"] != last:
            continue
        cell = table.setdefault((r["defense"], r["attack"]), {"nmi": [], "psnr": [], "ami": []})
        cell["nmi"].append(r["nmi"])
        cell["psnr"].append(r["psnr"])
        if r.get("ami") is not None:
            cell["ami"].append(r["ami"])
    means = {f"{d}/{a}": {k: (float(np.mean(v)) if v else None) for k, v in c.items()}
             for (d, a), c in sorted(table.items())}
    gains = {}
    for att in ("sgi", "gi"):
        none, pp = means.get(f"none/{att}"), means.get(f"priprune/{att}")
        if none is None or pp is None:
            continue
        g = {"paper": (none["nmi"] - pp["nmi"]) / none["nmi"],
             "above_floor": ((none["nmi"] - pp["nmi"]) / (none["nmi"] - f["nmi"])
                             if none["nmi"] > f["nmi"] else None),
             "ami": ((none["ami"] - pp["ami"]) / none["ami"]
                     if none["ami"] is not None and pp["ami"] is not None and none["ami"] > 0
                     else None)}
        gains[att] = g
    return {"last_round": last, "floor": {"nmi": f["nmi"], "ami": f["ami"], "psnr": f["psnr"],
                                          "B": f["B"], "image_size": f["image_size"]},
            "means": means, "priprune_gain": gains}


def part_a_readings(run: dict, floor: dict) -> dict | None:
    """Part A's p axis (Conv-2 at the p-axis batch): per scheme and p, mean NMI,
    AMI and PSNR over the victims for SGI and GI, beside that batch's floor; None
    when the run has no part-A rows."""
    rows = [r for r in run["rows"] if r["part"] == "A" and r["model"] == "conv2"]
    if not rows:
        return None
    batch = run.get("settings", {}).get("p_axis_batch") or max(r["B"] for r in rows)
    f = unrelated_floor(floor, int(run["image_size"]), int(batch))
    table = {}
    for r in rows:
        if r["B"] != batch:
            continue
        table.setdefault(r["base"], {}).setdefault(str(r["p"]), {})[r["attack"]] = {
            "nmi": r["nmi"], "psnr": r["psnr"], "ami": r.get("ami")}
    return {"B": int(batch), "floor": {"nmi": f["nmi"], "ami": f["ami"], "psnr": f["psnr"]},
            "schemes": table}


def markdown(result: dict) -> str:
    fmt = lambda v, d=3: "–" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [f"# chu2023 against NMI's unrelated-image floor ({result['source']})", "",
             f"`python -m benchmarks.chu2023_floor_reading {result['source']}` at commit "
             f"{short_commit(result['commit'])}; the run at commit {result['run_commit']}, "
             f"seed {result['run_seed']}, upload {result['run_upload']}. The floor: unrelated "
             "real images at the same batch size (`nmi_chance_floor.md`).", ""]
    fl = result["floor"]
    if fl is not None:
        lines += [f"Part B, last round {result['last_round']}; floor "
                  f"({fl['image_size']}×{fl['image_size']}, B = {fl['B']}): NMI {fl['nmi']:.3f}, "
                  f"AMI {fl['ami']:.3f}, PSNR {fl['psnr']:.1f} dB.", "",
                  "| defense / attack | NMI | AMI | PSNR (dB) |", "|---|---|---|---|"]
        for k, m in result["means"].items():
            lines.append(f"| {k} | {fmt(m['nmi'])} | {fmt(m['ami'])} | {fmt(m['psnr'], 1)} |")
        lines += ["", "PriPrune's privacy gain over PruneFL alone, three readings:", "",
                  "| attack | paper: ΔNMI / NMI_none | above the floor: ΔNMI / (NMI_none − floor) "
                  "| AMI: ΔAMI / AMI_none |", "|---|---|---|---|"]
        pct = lambda v: "–" if v is None else f"{100 * v:.1f} %"  # noqa: E731
        for att, g in result["priprune_gain"].items():
            lines.append(f"| {att} | {pct(g['paper'])} | {pct(g['above_floor'])} | "
                         f"{pct(g['ami'])} |")
        lines.append("")
    a = result.get("part_a")
    if a:
        fa = a["floor"]
        lines += [f"Part A, Conv-2 at B = {a['B']} (the p axis); floor NMI {fa['nmi']:.3f}, "
                  f"AMI {fa['ami']:.3f}, PSNR {fa['psnr']:.1f} dB.", "",
                  "| scheme | p | SGI NMI / AMI / PSNR | GI NMI / AMI / PSNR |",
                  "|---|---|---|---|"]
        cell = lambda m: "–" if m is None else (  # noqa: E731
            f"{fmt(m['nmi'])} / {fmt(m['ami'])} / {fmt(m['psnr'], 1)}")
        for scheme, by_p in sorted(a["schemes"].items()):
            for p_, atts in sorted(by_p.items(), key=lambda kv: float(kv[0])):
                lines.append(f"| {scheme} | {p_} | {cell(atts.get('sgi'))} | "
                             f"{cell(atts.get('gi'))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a reproduce_chu2023 results JSON with part-B rows")
    ap.add_argument("--floor", type=Path, default=FLOOR)
    ap.add_argument("--out", type=Path, required=True, help="DIR/NAME: writes NAME.json, NAME.md")
    args = ap.parse_args(argv)
    for p in (args.run, args.floor):
        if not p.exists():
            ap.error(f"no such file: {p}")
    try:
        run, floor = json.loads(args.run.read_text()), json.loads(args.floor.read_text())
    except json.JSONDecodeError as e:
        ap.error(f"not a JSON file ({e}): {args.run} or {args.floor}")
    for path, d, keys in ((args.run, run, ("rows", "image_size")), (args.floor, floor, ("rows",))):
        missing = [k for k in keys if not isinstance(d, dict) or k not in d]
        if missing:
            ap.error(f"{path} lacks {', '.join(missing)}: not a reproduce_chu2023 results file "
                     f"resp. a nmi_chance_floor file")
    result = readings(run, floor)
    result["part_a"] = part_a_readings(run, floor)
    if result["last_round"] is None and result["part_a"] is None:
        ap.error(f"{args.run} has neither part-A (Conv-2) nor part-B rows")
    settings = run.get("settings_B", run.get("settings", {}))
    result.update(commit=git_commit(), source=str(args.run), run_commit=str(run.get("commit")),
                  run_seed=run.get("seed"), run_upload=settings.get("upload", "weights"))
    write_json_and_markdown(args.out.parent, args.out.name, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
