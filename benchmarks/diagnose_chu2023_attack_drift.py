"""Why part B's attack metrics moved since ``chu2023_B.json`` although its uploads did not.

``benchmarks/results/chu2023_B.json`` was written at commit 06191db. Rerun
since (``chu2023_B_masked_start.json``), the no-defense rows' SGI/GI PSNR
moved by up to 0.52 dB, although those clients' uploads are bit-identical
(neither run gives them a start model of their own). One candidate is the
convolution the attack traces: since e814065 :class:`fedsim.models.Conv`
takes im2col inside ``models.vmapped_instances()`` (the attacks' vmap over
victims) up to a per-victim batch of ``VMAPPED_IM2COL_MAX_BATCH`` = 64,
where at 06191db a per-victim batch of 20 (part B's B) took XLA's
convolution. The two compute the same sums in another order, and a few
hundred attack iterations amplify the last-bit differences.

This runs ``reproduce_chu2023 --quick --parts B --pseudo-start kept`` (the
recorded run's settings, so every upload is the recorded one) at the current
commit twice, each in its own process:

- ``auto``: the current rule (im2col in the vmapped attack);
- ``xla``: ``models.conv_implementation("xla")``, XLA's convolution at every
  layer (at B = 20, outside a vmap, the current rule takes it as well).

and compares every row with the recorded file: accuracies (training) and
attack PSNR/NMI. If ``xla`` reproduces the recorded attack metrics and
``auto`` does not, the drift is the convolution path, not the uploads, the
keys or the machine.

Usage: ``python -m benchmarks.diagnose_chu2023_attack_drift [--rounds R]``
(``--rounds`` shortens both runs for a test; the comparison with the
record then only covers rows it still has). Writes
``benchmarks/results/chu2023_attack_drift.{json,md}`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.compare_chu2023_runs import row_key  # noqa: E402
from benchmarks.provenance import git_commit, short_commit  # noqa: E402

RECORD = ROOT / "benchmarks" / "results" / "chu2023_B.json"
RULES = ("auto", "xla")
METRICS = ("accuracy", "psnr", "nmi")

# Runs reproduce_chu2023's main under one convolution rule, in a fresh process
# (so no executable traced under the other rule is reused).
_RUN_ONE = """
import sys
from fedsim import models
from benchmarks import reproduce_chu2023
with models.conv_implementation(sys.argv[1]):
    reproduce_chu2023.main(sys.argv[2:])
"""


def run_rule(rule: str, out_dir: Path, rounds: int | None) -> tuple[dict, float]:
    """Part B (kept start, seed 0, quick) under one convolution rule; its results dict."""
    argv = ["--quick", "--parts", "B", "--pseudo-start", "kept", "--out", str(out_dir)]
    if rounds is not None:
        argv += ["--rounds", str(rounds)]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _RUN_ONE, rule, *argv], cwd=ROOT, check=True)
    seconds = time.perf_counter() - t0
    result = json.loads((out_dir / "chu2023_B.json").read_text())
    recorded = result.get("convolution", {}).get("implementation", rule)  # absent before 2026-11-27
    if recorded != rule:
        raise RuntimeError(f"the {rule!r} rerun recorded convolution {recorded!r}")
    return result, seconds


def compare_rows(record: dict, run: dict) -> dict:
    """Per metric: rows equal to the record (bit for bit), and the largest difference."""
    recorded = {row_key(r): r for r in record["rows"]}
    matched = [(recorded[row_key(r)], r) for r in run["rows"] if row_key(r) in recorded]
    out = {"rows_matched": len(matched), "rows": len(run["rows"])}
    for m in METRICS:
        diffs = [abs(float(new[m]) - float(old[m])) for old, new in matched]
        out[m] = {"equal": sum(d == 0.0 for d in diffs),
                  "largest_abs_difference": max(diffs, default=None)}
    return out


def row_table(record: dict, runs: dict) -> list[dict]:
    """Each recorded row's PSNR beside each rule's."""
    by_rule = {rule: {row_key(r): r for r in res["rows"]} for rule, res in runs.items()}
    table = []
    for r in record["rows"]:
        k = row_key(r)
        if not all(k in rows for rows in by_rule.values()):
            continue
        table.append({"defense": r["defense"], "attack": r["attack"], "round": r["round"],
                      "client_id": r["client_id"], "recorded_psnr": r["psnr"],
                      **{f"{rule}_psnr": by_rule[rule][k]["psnr"] for rule in runs}})
    return table


def markdown(result: dict) -> str:
    lines = [
        "# Part B's attack drift: the convolution path",
        "",
        "Produced by `python -m benchmarks.diagnose_chu2023_attack_drift"
        + (f" --rounds {result['rounds']}" if result["rounds"] else "") + "` at commit "
        f"{result['commit']} ({result['device']}). Each rule reruns `reproduce_chu2023 --quick "
        "--parts B --pseudo-start kept` (seed 0) in its own process and is compared with "
        f"`{result['record']}` (commit {result['record_commit'][:7]}), row by row.",
        "",
        "Commits the reruns recorded: " + ", ".join(
            f"{rule} {result['run_commits'][rule]}" for rule in RULES) + ".",
        "",
        "| rule | seconds | rows matched | " + " | ".join(
            f"{m}: equal / largest abs. difference" for m in METRICS) + " |",
        "|---|---|---|" + "---|" * len(METRICS),
    ]
    for rule in RULES:
        c = result["comparison"][rule]
        cells = []
        for m in METRICS:
            big = c[m]["largest_abs_difference"]
            cells.append(f"{c[m]['equal']} / {'—' if big is None else f'{big:.4g}'}")
        lines.append(f"| {rule} | {result['seconds'][rule]:.0f} | {c['rows_matched']} of "
                     f"{c['rows']} | " + " | ".join(cells) + " |")
    lines += ["", "| defense | attack | round | client | recorded PSNR | "
              + " | ".join(f"{rule} PSNR" for rule in RULES) + " |",
              "|---|---|---|---|---|" + "---|" * len(RULES)]
    for t in result["psnr_by_row"]:
        lines.append(f"| {t['defense']} | {t['attack']} | {t['round']} | {t['client_id']} | "
                     f"{t['recorded_psnr']:.3f} | "
                     + " | ".join(f"{t[f'{rule}_psnr']:.3f}" for rule in RULES) + " |")
    lines += ["", "Rules: `auto` is the current convolution rule (im2col inside the attacks' "
              "vmap over victims up to a per-victim batch of 64, since e814065); `xla` forces "
              "XLA's convolution at every layer (`models.conv_implementation(\"xla\")`), the "
              "path a per-victim batch of 20 took at the recorded commit.", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None,
                    help="FL rounds of both reruns (default: part B's quick 30)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                    help="folder for chu2023_attack_drift.{json,md}")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 3:
        ap.error(f"--rounds must be at least 3 (part B observes rounds 0, R/2 and R-1), "
                 f"got {args.rounds}")
    record = json.loads(RECORD.read_text())
    commit = git_commit()  # before the reruns: the code they load
    runs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for rule in RULES:
            runs[rule], seconds[rule] = run_rule(rule, Path(tmp) / rule, args.rounds)
    result = {
        "commit": short_commit(commit), "device": f"cpu ({platform.machine()})",
        "run_commits": {rule: runs[rule].get("commit") for rule in RULES},
        "rounds": args.rounds, "record": str(RECORD.relative_to(ROOT)),
        "record_commit": record["commit"], "seconds": seconds,
        "comparison": {rule: compare_rows(record, runs[rule]) for rule in RULES},
        "psnr_by_row": row_table(record, runs),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chu2023_attack_drift.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "chu2023_attack_drift.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
