"""Do PriPrune's λ_pri = 10 and 15 give the same global model? (issue #7 diagnostic)

Part B/C of ``reproduce_chu2023.py --quick`` reported the same global accuracy
(0.4427) for λ_pri = 10 and 15 although their uploads differ. This re-runs their
training loop (PruneFL p = 0.3 + PriPrune, the quick settings, seed 0) for R
rounds without the attacks and prints, per round, the global accuracy and the
withheld fraction over all client states, then how much the two final global
models and withheld masks differ.

Usage: ``python benchmarks/diagnose_priprune_lambda.py 20 | tee benchmarks/results/priprune_lambda_20rounds.txt``
"""

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reproduce_chu2023 as C  # noqa: E402
from defenses.pruning.global_mask import masked_gradient  # noqa: E402
from defenses.pruning.priprune import priprune_client_update, priprune_defense  # noqa: E402
from fedsim.data import load_dataset  # noqa: E402
from fedsim.simulation import Simulation  # noqa: E402


def train(rounds, lambda_pri, ds):
    """Part B's PruneFL (p = 0.3, re-pruned twice) + PriPrune loop, without the attacks.

    Mirrors ``reproduce_chu2023.part_b`` for one λ_pri; prints accuracy and the
    withheld fraction per round; returns the final global params and withheld masks.
    """
    a = argparse.Namespace(image_size=16, clients=50, clients_per_round=10, local_batch=8, lr=0.1,
                           lambda_acc=1.0, lambda_pri=lambda_pri, lambda_sha=2e-5, tau=0.5,
                           alpha_lr=0.5, alpha_init=0.4, reconfigs=2)
    cfg = C.fl_config(a, 0, rounds, [rounds - 1])
    reconfig = [int(rounds * k / a.reconfigs) for k in range(a.reconfigs)]
    state, mask, sim, k = None, None, None, 0
    for r in range(rounds):
        if r in reconfig:
            k += 1
            if sim is None:
                params = Simulation(cfg, dataset=ds).init_state().params
                n_params = sum(l.size for l in jax.tree_util.tree_leaves(params))
                mask = C.initial_mask("prunefl", None, params, 0.3)
            mask = C.prunefl_reprune(params if state is None else state.params, mask, 0.3, k,
                                     a.reconfigs)
            hp = C.priprune_hp(a, n_params)
            sim = Simulation(cfg, dataset=ds,
                             defenses={"layer": masked_gradient(mask), "upload": priprune_defense(hp)},
                             client_update_factory=priprune_client_update(hp))
            if state is None:
                state = sim.init_state()
            state = state._replace(params=C.apply_mask(state.params, mask))
        state, _ = sim.run_round(state, r)
        state = state._replace(params=C.apply_mask(state.params, mask))  # Alg 1 line 11
        leaves = jax.tree_util.tree_leaves(state.client_states["upload"]["withheld"])
        frac = float(sum(jnp.sum(l) for l in leaves) / sum(l.size for l in leaves))
        print(lambda_pri, r, "acc", round(sim.evaluate(state.params)[0], 4),
              "withheld frac (all clients)", frac, flush=True)
    return ravel_pytree(state.params)[0], ravel_pytree(state.client_states["upload"]["withheld"])[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", type=int, help="FL rounds (the quick reproduction uses 20)")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error(f"rounds must be >= 2 (PruneFL re-prunes at round rounds/2), got {args.rounds}")
    ds = load_dataset("fashion_mnist", image_size=16)
    (p10, w10), (p15, w15) = (train(args.rounds, lp, ds) for lp in (10.0, 15.0))
    d = p10 - p15
    print("max |global params diff| λ10 vs λ15:", float(jnp.max(jnp.abs(d))), "n differing",
          int(jnp.sum(d != 0)))
    print("withheld masks differ at", int(jnp.sum(w10 != w15)), "of", w10.size)


if __name__ == "__main__":
    main()
