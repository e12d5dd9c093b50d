"""SGI vs GI with each attack's TV weight tuned (issue #7, "SGI ≥ GI at every p").

Under Alg 1 weight uploads GI beats SGI at SNIP p = 0.1 at the TV weight both
attacks share (part A's 1e-3), and ``diagnose_gi_tv_scaling.py`` traced that to
the TV weight: GI's −w targets shrink its cosine term by s ≈ 15, as if it ran
SGI with a TV weight s times larger. Paper 002 does not give its attacks' TV
weights. An attacker tunes its own, so this script asks whether SGI ≥ GI holds
when each attack runs at the TV weight that suits it.

Per (scheme, p) setting named and per part-A Alg 1 run given (one per seed),
it rebuilds the run's model, mask and victims (``diagnose_sgi_vs_gi.rebuild``,
checked against the recorded shares), and runs GI and SGI with part A's attack
budget at every TV weight of a grid, all with one paired key per (seed,
setting) (``chu2023/A/tv_grid/<scheme>/<p>``, a stream no other part uses): the
victims, their initial dummies and the attack draws are the same in every arm.

Two ways of choosing each attack's TV weight, both reported:

* **held-out** (the verdict): for each seed, the weight with the best mean PSNR
  over the other seeds' victims; scored on this seed's victims. Tuning on the
  victims it is scored on would favour whichever attack's PSNR varies more
  over the grid.
* **in-sample** (an upper view): the weight with the best mean PSNR over all
  victims.

SGI − GI is then paired per victim (same victims, same key) and pooled over
seeds: mean and 95 % t interval, as part A's paired table computes them.

With ``--scaled-from t`` SGI also runs at t · s_v for each victim v, where
s_v = ‖Δ‖ / ‖Δ ⊙ m‖ (``diagnose_gi_tv_scaling.tv_factor``, read off the upload):
the weight GI at t has for that victim if the dummy's gradient is 0 on the pruned
coordinates. It is compared with GI at t, paired per victim.

Usage::

    python benchmarks/chu2023_tv_tuned.py                  # SNIP and SynFlow p = 0.1
    python benchmarks/chu2023_tv_tuned.py --stem chu2023_tv_tuned_fine \
        --tv-grid 1e-4,2e-4,3e-4,5e-4,1e-3,2e-3,3e-3,5e-3,1e-2,2e-2,3e-2,5e-2,1e-1 \
        --scaled-from 1e-3                                 # the committed fine run
    python benchmarks/chu2023_tv_tuned.py --render benchmarks/results/chu2023_tv_tuned.json

→ ``benchmarks/results/chu2023_tv_tuned.{json,md}``. The JSON is written after each
(seed, setting) cell, and a later run with the same ``--runs`` reuses its saved
arms (each records the commit it ran at): an interrupted run resumes, and a
wider ``--tv-grid`` runs only the new weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, too

from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.results_file import ResultsFileError, read_or_exit, read_results_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = ("chu2023_A_alg1.json", "chu2023_A_alg1_seed1.json", "chu2023_A_alg1_seed2.json")
SETTINGS = ("snip:0.1", "synflow:0.1")
TV_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
ATTACKS = ("gi", "sgi")
#: SGI with each victim's own TV weight, GI's times that victim's s = ‖Δ‖ / ‖Δ ⊙ m‖.
SCALED = "sgi_scaled"


def parse_settings(text: str) -> list[tuple[str, float]]:
    """``"snip:0.1,synflow:0.1"`` → ``[("snip", 0.1), ("synflow", 0.1)]``."""
    out = []
    for item in text.split(","):
        scheme, sep, p = item.strip().partition(":")
        try:
            out.append((scheme, float(p)))
        except ValueError:
            raise ValueError(f"{item!r} is not scheme:p") from None
        if not sep or not scheme:
            raise ValueError(f"{item!r} is not scheme:p")
    return out


def parse_grid(text: str) -> list[float]:
    """``"1e-4,1e-3"`` → sorted distinct positive TV weights."""
    try:
        grid = sorted({float(v) for v in text.split(",")})
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers") from None
    if not grid or grid[0] <= 0:
        raise ValueError(f"{text!r}: TV weights must be > 0")
    return grid


class NotRebuilt(ValueError):
    """The current code does not rebuild a part-A run's setting (its key streams or
    its models differ: a scheme fixed since the run was made)."""


def run_cell(result: dict, scheme: str, p: float, todo: list[tuple[str, float]],
             commit: str) -> dict:
    """The arms ``todo`` ((attack, TV weight) pairs) on one (seed, setting) of a part-A
    Alg 1 result: per arm, each victim's PSNR and NMI. ``commit`` is recorded per arm.

    Raises:
        NotRebuilt: the setting's models or key streams are not the run's.
    """
    from benchmarks.diagnose_gi_tv_scaling import attack_scores, rebuilt_setting, tv_factor
    from benchmarks.reproduce_chu2023 import part_a_key

    try:
        obs, truths, cfg = rebuilt_setting(result, scheme, p)
    except ValueError as e:
        raise NotRebuilt(str(e)) from None
    key, key_name = part_a_key(result["seed"], "tv_grid", scheme, p)
    arms = []
    factors = tv_factor(obs)
    for attack, tv in todo:
        t0 = time.perf_counter()
        if attack == SCALED:  # victim v's reconstruction from a run at tv · s_v
            tvs = [tv * f for f in factors]
            scores = [attack_scores("sgi", obs, truths, {**cfg, "tv": t}, key, result)[v]
                      for v, t in enumerate(tvs)]
        else:
            tvs = None
            scores = attack_scores(attack, obs, truths, {**cfg, "tv": tv}, key, result)
        arms.append({"attack": attack, "tv": tv, **({"tv_victims": tvs} if tvs else {}),
                     "psnr_victims": [float(b) for _, b in scores],
                     "nmi_victims": [float(a) for a, _ in scores],
                     "seconds": time.perf_counter() - t0, "commit": commit})
        print(f"  seed {result['seed']} {scheme} p={p} {attack} tv={tv:g}"
              f"{' × s_v' if tvs else ''}: PSNR {np.mean(arms[-1]['psnr_victims']):.2f}",
              flush=True)
    return {"seed": result["seed"], "scheme": scheme, "p": p, "key": key_name,
            "attack": cfg, "tv_factor_victims": factors, "arms": arms,
            "source_commit": result.get("commit")}


def missing_arms(cell: dict | None, grid: list[float],
                 scaled_from: float | None = None) -> list[tuple[str, float]]:
    """The (attack, TV weight) pairs of ``grid`` that ``cell`` (None: no cell yet) lacks,
    and the per-victim scaled SGI arm from GI's weight ``scaled_from`` if asked."""
    have = {(a["attack"], a["tv"]) for a in (cell or {}).get("arms", [])}
    want = [(a, tv) for a in ATTACKS for tv in grid]
    if scaled_from is not None:
        want.append((SCALED, scaled_from))
    return [arm for arm in want if arm not in have]


def merge_cell(old: dict | None, new: dict, grid: list[float]) -> dict:
    """``new`` with ``old``'s arms on ``grid`` added (the same seed, setting and key),
    arms sorted by attack and weight."""
    arms = [a for a in (old or {}).get("arms", []) if _kept(a, grid)] + new["arms"]
    if old is not None and old["key"] != new["key"]:
        raise ValueError(f"seed {new['seed']} {new['scheme']} p={new['p']}: the saved arms "
                         f"used key {old['key']}, not {new['key']}")
    order = ATTACKS + (SCALED,)
    return {**new, "arms": sorted(arms, key=lambda a: (order.index(a["attack"]), a["tv"]))}


def _kept(arm: dict, grid: list[float]) -> bool:
    """Whether a saved arm belongs to a run on ``grid`` (a scaled arm always does)."""
    return arm["attack"] == SCALED or arm["tv"] in grid


def _psnr(cell: dict, attack: str, tv: float) -> list[float]:
    return next(a["psnr_victims"] for a in cell["arms"]
                if a["attack"] == attack and a["tv"] == tv)


def best_tv(cells: list[dict], attack: str, grid: list[float]) -> float:
    """The grid weight with the best mean PSNR over the victims of ``cells`` (the
    smallest such weight on a tie)."""
    means = [np.mean([v for c in cells for v in _psnr(c, attack, tv)]) for tv in grid]
    return grid[int(np.argmax(means))]


def analyse(cells: list[dict], grid: list[float], shared_tv: float | None) -> list[dict]:
    """Per setting: each attack's PSNR over the grid, its held-out and in-sample TV
    choices, and SGI − GI paired per victim under each choice (and at the shared
    weight of the part-A runs, where it is on the grid)."""
    from benchmarks.reproduce_chu2023 import _paired_summary

    out = []
    for scheme, p in sorted({(c["scheme"], c["p"]) for c in cells}):
        mine = sorted((c for c in cells if (c["scheme"], c["p"]) == (scheme, p)),
                      key=lambda c: c["seed"])
        entry = {"scheme": scheme, "p": p, "seeds": [c["seed"] for c in mine],
                 "victims": sum(len(c["arms"][0]["psnr_victims"]) for c in mine),
                 "grid_psnr": {a: [float(np.mean([v for c in mine for v in _psnr(c, a, tv)]))
                                   for tv in grid] for a in ATTACKS}}
        held = {a: [] for a in ATTACKS}
        diffs = []
        for c in mine:
            others = [o for o in mine if o is not c]
            if not others:
                break
            picks = {a: best_tv(others, a, grid) for a in ATTACKS}
            for a in ATTACKS:
                held[a].append(picks[a])
            diffs += list(np.subtract(_psnr(c, "sgi", picks["sgi"]), _psnr(c, "gi", picks["gi"])))
        if len(mine) > 1:
            entry["held_out"] = {"tv": held, **_paired_summary(diffs),
                                 **_mean_psnr(mine, held)}
        inside = {a: best_tv(mine, a, grid) for a in ATTACKS}
        entry["in_sample"] = {"tv": inside, **_paired(mine, inside),
                              **_mean_psnr(mine, {a: [inside[a]] * len(mine) for a in ATTACKS})}
        if shared_tv in grid:
            same = {a: shared_tv for a in ATTACKS}
            entry["shared"] = {"tv": shared_tv, **_paired(mine, same),
                               **_mean_psnr(mine, {a: [shared_tv] * len(mine) for a in ATTACKS})}
        scaled = sorted({a["tv"] for c in mine for a in c["arms"] if a["attack"] == SCALED})
        for tv in scaled:
            if tv not in grid or not all(any(a["attack"] == SCALED and a["tv"] == tv
                                             for a in c["arms"]) for c in mine):
                continue
            entry.setdefault("scaled", []).append(_scaled_entry(mine, tv))
        out.append(entry)
    return out


def _scaled_entry(cells: list[dict], tv: float) -> dict:
    """SGI at tv × s_v per victim against GI at tv, paired per victim."""
    from benchmarks.reproduce_chu2023 import _paired_summary
    sc = [v for c in cells for v in _psnr(c, SCALED, tv)]
    gi = [v for c in cells for v in _psnr(c, "gi", tv)]
    return {"tv": tv, "gi_psnr": float(np.mean(gi)), "sgi_psnr": float(np.mean(sc)),
            "tv_victims": [t for c in cells for a in c["arms"]
                           if a["attack"] == SCALED and a["tv"] == tv for t in a["tv_victims"]],
            **_paired_summary(np.subtract(sc, gi))}


def _paired(cells: list[dict], tv: dict) -> dict:
    """SGI − GI per victim of every cell, each attack at its weight ``tv[attack]``."""
    from benchmarks.reproduce_chu2023 import _paired_summary
    return _paired_summary([s - g for c in cells for s, g in zip(_psnr(c, "sgi", tv["sgi"]),
                                                                 _psnr(c, "gi", tv["gi"]))])


def _mean_psnr(cells: list[dict], tvs: dict) -> dict:
    """Each attack's mean PSNR over the victims of every cell, cell k's at ``tvs[a][k]``."""
    return {f"{a}_psnr": float(np.mean([v for c, tv in zip(cells, tvs[a])
                                        for v in _psnr(c, a, tv)])) for a in ATTACKS}


def markdown(out: dict) -> str:
    grid = out["grid"]
    lines = ["# SGI vs GI with each attack's TV weight tuned (Alg 1 uploads)", "",
             f"Part A's Alg 1 runs {', '.join(f'`{r}`' for r in out['runs'])} (their models, "
             f"masks and victims, rebuilt), attack budget {out['attack']} with the TV weight "
             f"varied over {', '.join(f'{t:g}' for t in grid)}. One paired key per (seed, "
             "setting) for both attacks and every weight. Produced by "
             f"`python benchmarks/chu2023_tv_tuned.py {' '.join(out['argv'])}` (last run at "
             f"commit {out['commit']}; arms run at "
             + ", ".join(sorted({str(a.get('commit')) for c in out['cells']
                                 for a in c['arms']})) + ").", "",
             "**held-out**: each seed's victims are scored at the weight that was best (mean "
             "PSNR) on the other seeds' victims, per attack: the verdict. **in-sample**: each "
             "attack at its best weight over all victims. SGI − GI is paired per victim; mean "
             "and 95 % t interval over the victims of every seed. The acceptance check "
             "compares means.", "",
             "## Mean PSNR (dB) over every victim, per TV weight", "",
             "| setting | attack | " + " | ".join(f"{t:g}" for t in grid) + " |",
             "|---|---|" + "---|" * len(grid)]
    for e in out["settings"]:
        for a in ATTACKS:
            lines.append(f"| {e['scheme']} p = {e['p']:g} | {a.upper()} | "
                         + " | ".join(f"{v:.2f}" for v in e["grid_psnr"][a]) + " |")
    lines += ["", "## SGI − GI (dB), paired over victims", "",
              "| setting | seeds | victims | choice | GI TV | SGI TV | GI PSNR | SGI PSNR | "
              "SGI − GI | 95 % CI | victims resolve | SGI ≥ GI (means) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in out["settings"]:
        for name in ("shared", "in_sample", "held_out"):
            if name not in e:
                continue
            r = e[name]
            tv = r["tv"]
            gi_tv, sgi_tv = ((tv, tv) if name == "shared" else (tv["gi"], tv["sgi"]))
            fmt = lambda t: ", ".join(f"{v:g}" for v in t) if isinstance(t, list) else f"{t:g}"
            psnr = f"{r['gi_psnr']:.2f} | {r['sgi_psnr']:.2f}"
            lines.append(
                f"| {e['scheme']} p = {e['p']:g} | {', '.join(map(str, e['seeds']))} | "
                f"{e['victims']} | {name.replace('_', '-')} | {fmt(gi_tv)} | {fmt(sgi_tv)} | "
                f"{psnr} | {r['mean']:+.2f} | {r['ci'][0]:+.2f} to {r['ci'][1]:+.2f} | "
                f"{r['verdict']} | {'yes' if r['mean'] >= 0 else 'no'} |")
    lines += ["", "Held-out TV weights are listed per seed, in the order of the seeds column."]
    scaled = [(e, r) for e in out["settings"] for r in e.get("scaled", [])]
    if scaled:
        lines += ["", "## SGI at GI's weight × s per victim", "",
                  "If the dummy's gradient is 0 on the pruned coordinates, GI at TV weight t "
                  "is SGI at t · s_v for victim v (s_v = ‖Δ‖ / ‖Δ ⊙ m‖, "
                  "`diagnose_gi_tv_scaling.py`). Each victim's SGI reconstruction comes from a "
                  "run of all its seed's victims at that victim's weight (same key), so it "
                  "stays paired with GI's.", "",
                  "| setting | GI TV | SGI TV per victim | GI PSNR | SGI PSNR | SGI − GI | "
                  "95 % CI | victims resolve |", "|---|---|---|---|---|---|---|---|"]
        for e, r in scaled:
            lines.append(
                f"| {e['scheme']} p = {e['p']:g} | {r['tv']:g} | "
                f"{min(r['tv_victims']):.3g}–{max(r['tv_victims']):.3g} | {r['gi_psnr']:.2f} | "
                f"{r['sgi_psnr']:.2f} | {r['mean']:+.2f} | {r['ci'][0]:+.2f} to "
                f"{r['ci'][1]:+.2f} | {r['verdict']} |")
    rest = out.get("not_run")
    if rest:
        lines += [
            "", f"Not run here: the other {rest['settings']} p-axis settings of these runs. At "
            f"the shared weight SGI − GI is at least {rest['min_gap']:+.2f} dB at each of them "
            f"in each run ({rest['where']}, the runs' own rows)."]
    for miss in out.get("not_rebuilt", []):
        lines += ["", f"Not rebuilt, so skipped (and counted above if no other seed ran it): "
                      f"{miss['scheme']} p = {miss['p']:g} at seed {miss['seed']}. "
                      f"{miss['reason']}."]
    return "\n".join(lines + [""])


def not_run(runs: list[dict], settings) -> dict | None:
    """The p-axis settings of ``runs`` left out, and the smallest SGI − GI mean (at
    the runs' shared TV weight, from their rows) among them, over every run."""
    from benchmarks.reproduce_chu2023 import sgi_gi_paired
    gaps = [(e["mean"], f"{e['base']} p = {e['p']:g}, seed {r['seed']}")
            for r in runs for e in sgi_gi_paired(r["rows"])
            if (e["base"], e["p"]) not in settings]
    if not gaps:
        return None
    gap, where = min(gaps)
    return {"settings": len({w.rsplit(",", 1)[0] for _, w in gaps}), "min_gap": gap,
            "where": where}


def _load_runs(folder: Path, names) -> list[dict]:
    """The part-A results ``names`` in ``folder``.

    Raises:
        FileNotFoundError: one is missing.
        ResultsFileError: one is not a JSON object (truncated, not JSON, not text).
    """
    runs = []
    for name in names:
        path = folder / name
        if not path.exists():
            raise FileNotFoundError(f"--results {folder}: no {name} (run reproduce_chu2023.py "
                                    "--quick --parts A --a-protocol alg1 at that seed first)")
        runs.append(read_results_json(path, "--runs"))
    return runs


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS), help="folder holding the part-A runs")
    ap.add_argument("--runs", default=",".join(RUNS),
                    help="part-A Alg 1 result files in --results, one per seed")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="scheme:p,...")
    ap.add_argument("--tv-grid", default=",".join(f"{t:g}" for t in TV_GRID))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--stem", default="chu2023_tv_tuned")
    ap.add_argument("--scaled-from", type=float, metavar="TV",
                    help="also run SGI at TV × s_v for each victim v (s_v = ‖Δ‖ / ‖Δ ⊙ m‖): "
                         "GI's weight TV as SGI would see it per victim, if the dummy's "
                         "gradient is 0 on the pruned coordinates; compared with GI at TV")
    ap.add_argument("--render", metavar="JSON", help="rewrite the markdown of a results JSON")
    args = ap.parse_args(argv)
    if args.render:
        path = Path(args.render)
        out = read_or_exit(ap, path, "--render")
        try:  # the runs at hand: recount what was not run (an interrupted run's cells)
            runs = _load_runs(Path(args.results), out["runs"])
        except FileNotFoundError:
            runs = None
        except ResultsFileError as e:
            ap.error(str(e))
        if runs is not None:
            out["not_run"] = not_run(runs, {(c["scheme"], c["p"]) for c in out["cells"]})
            path.write_text(json.dumps(out, indent=1, default=float))
        path.with_suffix(".md").write_text(markdown(out))
        return out
    if args.scaled_from is not None and args.scaled_from <= 0:
        ap.error(f"--scaled-from {args.scaled_from:g}: a TV weight must be > 0")
    try:
        settings = parse_settings(args.settings)
    except ValueError as e:
        ap.error(f"--settings: {e}")
    try:
        grid = parse_grid(args.tv_grid)
    except ValueError as e:
        ap.error(f"--tv-grid: {e}")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    try:
        runs = _load_runs(Path(args.results), names)
    except (FileNotFoundError, ResultsFileError) as e:
        ap.error(str(e))
    from benchmarks.diagnose_sgi_vs_gi import p_axis_of

    for name, r in zip(names, runs):  # a setting off a run's p axis is a typo: say so now
        try:
            off = [f"{s}:{q:g}" for s, q in settings if (s, q) not in p_axis_of(r)]
        except (KeyError, ValueError) as e:
            ap.error(f"--runs {name}: not a part-A result ({e})")
        if off:
            ap.error(f"--settings {','.join(off)}: not on the p axis of {name}")
    attack = {k: v for k, v in runs[0]["settings"]["attack"].items() if k != "tv"}
    if any({k: v for k, v in r["settings"]["attack"].items() if k != "tv"} != attack
           for r in runs):
        ap.error("--runs: the runs' attack settings differ beyond the TV weight")
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    json_path = dest / f"{args.stem}.json"
    argv_list = list(argv if argv is not None else sys.argv[1:])
    commit = git_commit()  # at the start: the code that runs is this commit's
    saved = {}
    if json_path.exists():  # resume: reuse the saved arms of the same runs
        old = json.loads(json_path.read_text())
        if old.get("runs") == names:
            saved = {(c["seed"], c["scheme"], c["p"]): c for c in old["cells"]}
            for c in saved.values():  # arms saved before commits were recorded per arm
                for a in c["arms"]:
                    a.setdefault("commit", c.get("commit"))
    shared = runs[0]["settings"]["attack"].get("tv")
    cells, not_rebuilt = [], []

    def write():  # "not_run" counts the settings without cells, so an interrupted run says so
        out = {"runs": names, "grid": grid, "attack": attack, "argv": argv_list,
               "commit": commit, "cells": cells, "settings": analyse(cells, grid, shared),
               "not_run": not_run(runs, {(c["scheme"], c["p"]) for c in cells}),
               "not_rebuilt": not_rebuilt}
        json_path.write_text(json.dumps(out, indent=1, default=float))
        return out

    for result in runs:
        for scheme, p in settings:
            old = saved.get((result["seed"], scheme, p))
            todo = missing_arms(old, grid, args.scaled_from)
            if not todo:
                cells.append({**old, "arms": [a for a in old["arms"] if _kept(a, grid)]})
                continue
            try:
                new = run_cell(result, scheme, p, todo, commit)
            except NotRebuilt as e:
                # This run's models are not what the current code rebuilds (a scheme
                # fixed since the run was made): skipped and recorded, the rest goes on.
                not_rebuilt.append({"seed": result["seed"], "scheme": scheme, "p": p,
                                    "reason": str(e)})
                print(f"  seed {result['seed']} {scheme} p={p}: not rebuilt, skipped: {e}",
                      flush=True)
                write()
                continue
            try:
                cells.append(merge_cell(old, new, grid))
            except ValueError as e:
                ap.error(f"--settings {scheme}:{p:g}: {e}")
            write()
    out = write()
    md = markdown(out)
    json_path.with_suffix(".md").write_text(md)
    print(md)
    return out


if __name__ == "__main__":
    main()
