"""Which accounting reproduces the Gaussian sigma column of 001 Table IV?

Table IV of Biswas et al. (001) lists, next to each VMF kappa and its epsilon,
a Gaussian noise multiplier sigma "giving the same epsilon". This script
calibrates sigma for each printed epsilon under several accountings and
prints (and writes to benchmarks/results/gaussian_sigma_column.md) the
relative error of each against the printed sigma.

Setting: gamma = 128/60000, 3 epochs, delta = 1/60000 unless stated.

Run:  python benchmarks/gaussian_sigma_column.py
"""

from __future__ import annotations

import functools
import pathlib
import sys

import numpy as np
from scipy import optimize

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from defenses.accounting import (  # noqa: E402
    approach_one,
    approach_two,
    gaussian_epsilon,
    gaussian_noise_for_epsilon,
    gaussian_rdp_unsampled,
    steps_for_epochs,
)

GAMMA = 128 / 60000
DELTA = 1 / 60000
EPOCHS = 3
# (kappa, epsilon, sigma) as printed in 001 Table IV.
TABLE = [
    (75, 0.49, 1.23), (100, 2.48, 0.660), (125, 4.59, 0.544), (150, 7.97, 0.461),
    (175, 9.72, 0.435), (200, 10.9, 0.420), (225, 17.25, 0.367), (250, 27.38, 0.321),
    (275, 38.84, 0.287), (300, 41.02, 0.282), (325, 64.98, 0.245), (350, 79.68, 0.229),
    (375, 95.44, 0.214), (400, 112.28, 0.204), (500, 173.0, 0.174),
]


def _sigma_via_approaches(eps: float, count: int, which: str) -> float:
    """sigma whose best-of approach 1/2 (001 §III-A) epsilon equals eps."""

    def eps_of(log_sigma: float) -> float:
        fn = functools.partial(gaussian_rdp_unsampled, float(np.exp(log_sigma)))
        if which == "1":
            return approach_one(fn, GAMMA, count, DELTA, grid_size=48)[0]
        return approach_two(fn, GAMMA, count, DELTA, max_order=256)[0]

    lo, hi = np.log(0.02), np.log(50.0)
    if (eps_of(lo) - eps) * (eps_of(hi) - eps) > 0:
        return float("nan")
    return float(np.exp(optimize.brentq(lambda v: eps_of(v) - eps, lo, hi, xtol=1e-5)))


def main() -> str:
    steps = steps_for_epochs(EPOCHS, GAMMA)
    variants = {
        f"RDP per-step (T={steps})": lambda e: gaussian_noise_for_epsilon(e, GAMMA, DELTA, steps=steps),
        "RDP per-step, delta=1e-5": lambda e: gaussian_noise_for_epsilon(e, GAMMA, 1e-5, steps=steps),
        "RDP per-epoch (N=3)": lambda e: gaussian_noise_for_epsilon(e, GAMMA, DELTA, compositions=EPOCHS),
        "approach 1, N=3": lambda e: _sigma_via_approaches(e, EPOCHS, "1"),
        "approach 2, N=3": lambda e: _sigma_via_approaches(e, EPOCHS, "2"),
    }
    names = list(variants)
    rows = []
    for kappa, eps, sigma in TABLE:
        found = {}
        for name in names:
            try:
                found[name] = variants[name](eps)
            except Exception as err:  # a variant may not bracket every row
                found[name] = float("nan")
                print(f"  {name} failed at eps={eps}: {err}")
        rows.append((kappa, eps, sigma, found))
        print(kappa, eps, sigma, {k: round(v, 4) for k, v in found.items()})

    lines = [
        "# 001 Table IV: which accounting gives the printed Gaussian sigma?",
        "",
        f"gamma = 128/60000, {EPOCHS} epochs, delta = 1/60000 unless stated; sigma calibrated so "
        "that each accounting reports the printed epsilon. Cells: calibrated sigma "
        "(relative error vs printed sigma).",
        "",
        "| kappa | eps | printed sigma | " + " | ".join(names) + " |",
        "|" + "---|" * (3 + len(names)),
    ]
    errs = {n: [] for n in names}
    for kappa, eps, sigma, found in rows:
        cells = []
        for n in names:
            v = found[n]
            rel = (v - sigma) / sigma
            errs[n].append(abs(rel))
            cells.append(f"{v:.4f} ({rel:+.1%})" if np.isfinite(v) else "n/a")
        lines.append(f"| {kappa} | {eps} | {sigma} | " + " | ".join(cells) + " |")
    lines += ["", "| accounting | median abs rel err | max abs rel err |", "|---|---|---|"]
    for n in names:
        e = np.array(errs[n])
        e = e[np.isfinite(e)]
        med = f"{np.median(e):.1%}" if e.size else "n/a"
        mx = f"{np.max(e):.1%}" if e.size else "n/a"
        lines.append(f"| {n} | {med} | {mx} |")
    # PLD calibration at small sigma needs tens of GiB; evaluate eps at the
    # printed sigma instead.
    lines += [
        "",
        "## epsilon at the printed sigma",
        "",
        f"| kappa | printed eps | sigma | RDP per-step (T={steps}) | PLD per-step (T={steps}) | RDP per-epoch (N=3) |",
        "|---|---|---|---|---|---|",
    ]
    for kappa, eps, sigma in TABLE:
        r = gaussian_epsilon(sigma, GAMMA, DELTA, steps=steps).epsilon
        try:
            pld = f"{gaussian_epsilon(sigma, GAMMA, DELTA, steps=steps, accountant='pld').epsilon:.4g}"
        except MemoryError:
            pld = "n/a (memory)"
        r3 = gaussian_epsilon(sigma, GAMMA, DELTA, compositions=EPOCHS).epsilon
        lines.append(f"| {kappa} | {eps} | {sigma} | {r:.4g} | {pld} | {r3:.4g} |")
    lines += [
        "",
        "## Finding",
        "",
        "The printed sigma column is reproduced (within 0.5 % on every row) by *standard per-step*",
        f"RDP accounting (dp_accounting RDP, T = ceil(3 / gamma) = {steps} steps, delta = 1/60000):",
        "the sigma that gives the printed epsilon per step. It is *not* reproduced by the paper's own",
        "per-epoch convention (N = 3) with which the VMF epsilons were computed (sigma off by 8-55 %),",
        "nor by approaches 1/2 applied to the Gaussian, nor by PLD (PLD is much tighter: at the printed",
        "sigma it reports a smaller epsilon). So Table IV pairs VMF epsilons composed once per epoch",
        "with Gaussian sigmas composed once per step: at equal printed epsilon the Gaussian rows carry",
        "a ~470x larger composition count, i.e. the two columns are not the same privacy level.",
    ]
    text = "\n".join(lines) + "\n"
    out = pathlib.Path(__file__).parent / "results" / "gaussian_sigma_column.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
