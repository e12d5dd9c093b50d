"""Reproduce the trends of Chu et al. 2023 (PriPrune, paper 002) on Fashion-MNIST.

FEMNIST / CIFAR-10 are not available offline: by default we use Fashion-MNIST
(real data, /usr/share/datasets/fashion-mnist) with Dirichlet(0.5) label
partitions. ``--dataset`` takes any dataset ``fedsim.data.load_dataset`` knows
(emnist, cifar10, ... through tensorflow-datasets where a network or a
prepared data_dir exists), and ``--partition natural`` gives one client per
writer/identity id where the dataset carries them (a FEMNIST-style writer
split; tfds' ``emnist`` has no writer ids, so it needs such a source). A run
on another dataset or partition writes ``chu2023_<dataset>[_natural]_*``
files, and ``--combine`` merges only the parts of its own dataset and partition.

Two parts, every row from this script in one run (seeds in the JSON):

A. Attacks on pruned uploads (Fig 2, Fig 7, Fig 8/9): the six base schemes
   mask the model at rate p; a victim batch's FedSGD upload Δ = −lr·(g ⊙ m)
   at the initial global model is attacked by GI (Inverting Gradients, cosine,
   Geiping et al.) and SGI (Alg 2). Axes: p, B, model size. Variants (``--parts A``
   alone): ``--a-trained-rounds R`` attacks each pruned Conv-2 after R FedAvg
   rounds; ``--a-protocol alg1`` follows the paper's Alg 1 literally: the victim
   takes its step on the dense model and prunes its trained model, uploading
   masked weights, so GI's target holds −w at the pruned coordinates and SGI
   reads the mask off the upload's zeros.
B. Pruned FL training with PruneFL as the base (p = 0.3) and the defenses of
   §5: none, Largest / Random / Mix (p̂ = 0.3; Mix 0.15 + 0.15), each with and
   without Pseudo-Pruning, and PriPrune (Fig 4, Fig 5). Test accuracy at the
   end; SGI on the observed client's upload in the observed rounds (Fig 2(d):
   vs rounds) and GI on the last one.

Clients run one local SGD step on their batch of B = 20 (the paper's FEMNIST
setting "FedSGD, batch 20, one local update"): each client holds B examples.

Usage:
  python -m benchmarks.reproduce_chu2023 --quick   # ~minutes on 2 CPU cores
  python -m benchmarks.reproduce_chu2023           # larger (not run here)
  python -m benchmarks.reproduce_chu2023 --quick --dataset emnist   # where tfds has it
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
import weakref
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attacks import inverting_gradients, sgi
from attacks.metrics import ami, match_reconstructions, nmi, psnr
from benchmarks.provenance import git_commit
from defenses.pruning import apply_mask, flatten
from defenses.pruning.defense_prune import prune_largest, prune_mix, prune_random
from defenses.pruning.global_mask import masked_gradient, masked_upload
from defenses.pruning.priprune import (PriPruneConfig, defense_rate, priprune_client_update,
                                       priprune_defense)
from defenses.pruning.schemes import (SCHEMES, initial_mask, one_shot_mask, prunable,
                                      prunefl_reprune)
from fedsim.client import masked_mean_loss
from fedsim.config import OBSERVER_FILLS, load_config
from fedsim.hooks import chain, mask_start
from fedsim.keys import ENGINE_INIT, experiment_key, numpy_generator
from fedsim import models
from fedsim.models import build_model, init_params, make_apply_fn
from fedsim.observer import restrict
from fedsim.simulation import Simulation
from fedsim.typing import Observation

RESULTS = Path(__file__).parent / "results"
DEFAULT_DATASET = "fashion_mnist"
PARTITIONS = ("dirichlet", "natural")


def output_stem(dataset: str = DEFAULT_DATASET, partition: str = "dirichlet") -> str:
    """File stem of a run's outputs: ``chu2023`` for the default Fashion-MNIST
    Dirichlet runs, ``chu2023_<dataset>[_natural]`` otherwise (``/`` of a tfds
    config such as ``emnist/letters`` becomes ``_``), so another dataset's or
    partition's results never overwrite, or get merged into, these."""
    if dataset == DEFAULT_DATASET and partition == "dirichlet":
        return "chu2023"
    slug = re.sub(r"[^A-Za-z0-9]+", "_", dataset).strip("_")
    return f"chu2023_{slug}" + ("_natural" if partition == "natural" else "")


PAPER = {
    "source": "Chu et al. 2023 (arXiv v2), FEMNIST; shared/reference/paper_numbers.md",
    "priprune_vs_prunefl_privacy_gain_femnist": 0.363,
    "priprune_accuracy_loss": "none (same accuracy as PruneFL)",
    "trends": ["NMI/PSNR fall as p grows (0.1-0.9)", "NMI falls as B grows",
               "NMI rises with model size and rounds T", "SGI >= GI at every p",
               "Largest: most privacy, least accuracy; Pseudo-Pruning restores accuracy"],
    "base_rate": 0.3, "defense_rate": 0.3, "mix": [0.15, 0.15], "lr": 0.25, "batch": 20,
}


def scheme_mask(scheme, key, params, p, apply_fn, x, y, input_shape, synflow_its):
    """A scheme's mask at rate p on the initial model (iterative ones: one step;
    :func:`defenses.pruning.schemes.one_shot_mask`, which configs' ``pruning`` use too)."""
    return one_shot_mask(scheme, key, params, p, apply_fn=apply_fn, x=x, y=y,
                         input_shape=input_shape, synflow_iterations=synflow_its)


def score(x_rec, x_true):
    x_rec, x_true = np.asarray(x_rec), np.asarray(x_true)
    x_rec = x_rec[match_reconstructions(x_rec, x_true)]
    return nmi(x_rec, x_true), float(np.mean(psnr(x_rec, x_true)))


def score_ami(x_rec, x_true) -> float:
    """AMI (NMI adjusted for chance, :func:`attacks.metrics.ami`) after the same
    matching as :func:`score`: NMI's floor depends on the batch size
    (benchmarks/results/nmi_chance_floor.md), AMI's chance part does not."""
    x_rec, x_true = np.asarray(x_rec), np.asarray(x_true)
    return ami(x_rec[match_reconstructions(x_rec, x_true)], x_true)


def sgi_mask_of(args) -> str:
    """``args.sgi_mask`` (:data:`attacks.sgi.MASKS`); ``support`` for settings
    recorded before the option existed, the rule SGI had then."""
    return getattr(args, "sgi_mask", "support")


def with_split(attack_cfg: dict, args) -> dict:
    """``attack_cfg`` with ``args.victims_per_call`` where one is given.

    Without it each attack call takes as many victims as the free memory allows
    (:func:`attacks.gradient_inversion.invert_victims`), and calls of another size
    give other numbers at float rounding, which signed Adam amplifies (up to 0.37 dB
    on a victim of Inverting Gradients, benchmarks/results/attack_split_determinism.md). The
    rows record the size each call had (``attack_victims_per_call``), so a rerun with
    ``--victims-per-call`` set to it repeats the numbers on a machine with other free
    memory."""
    k = getattr(args, "victims_per_call", None)
    return attack_cfg if k is None else {**attack_cfg, "victims_per_call": k}


def attack_all(obs_list, attack_cfg, key, upload="update", mask="model"):
    """GI and SGI on every observation (vmapped, one compile per attack).

    Paired: both attacks get the same key, hence the same labels and the same
    initial dummies per victim and restart; they differ only in SGI's mask
    (``mask``: :data:`attacks.sgi.MASKS`). ``upload="weights"``: the
    observations carry weight uploads as ŵ − w, and SGI reads its mask off ŵ
    (Alg 2 lines 3–4); GI attacks ŵ − w as it is.
    """
    gi = inverting_gradients.run_many(obs_list, attack_cfg, key)
    sg = sgi.run_many(obs_list, {**attack_cfg, "upload": upload, "mask": mask}, key)
    return gi, sg


def masked_simulation(args, ds, mask, seed, rounds):
    """Part B's FL setting for a pruned model whose mask stays fixed (no re-pruning):
    the global mask on every local step's gradient and on the upload."""
    cfg = fl_config(args, seed, rounds, [], observe_clients=[])
    return Simulation(cfg, dataset=ds, defenses={"layer": masked_gradient(mask),
                                                 "upload": masked_upload(mask)})


def masked_rounds(sim, params, mask, rounds):
    """Yield (round, masked params) after each of ``rounds`` FedAvg rounds of ``sim`` from
    ``params``; the server re-applies the mask after each round (Alg 1 line 11)."""
    state = sim.init_state()
    state = state._replace(params=apply_mask(params, mask))
    for r in range(rounds):
        state, _ = sim.run_round(state, r)
        state = state._replace(params=apply_mask(state.params, mask))
        yield r, state.params


def train_masked(args, ds, params, mask, seed, rounds):
    """FedAvg of the pruned model for ``rounds`` rounds from ``params`` (part B's FL setting,
    :func:`masked_simulation`). Returns the trained, masked params and the test accuracy."""
    sim = masked_simulation(args, ds, mask, seed, rounds)
    trained = apply_mask(params, mask)
    for _, trained in masked_rounds(sim, params, mask, rounds):
        pass
    return trained, sim.evaluate(trained)[0]


A_PROTOCOLS = ("pruned_model", "alg1")


def victim_observations(apply_fn, params, mask, ds, victims, lr=0.25, protocol="pruned_model"):
    """What the server sees of each victim batch, restricted to labels and batch size.

    ``protocol="pruned_model"`` (part A's default): the server sends the pruned model
    ``params`` (zeros where ``mask`` is 0) and the victim uploads its FedSGD update
    Δ = −lr·(g ⊙ m), g the gradient at the pruned model.
    ``protocol="alg1"`` (the paper's Alg 1, "Local Training and Pruning"): the server
    sends the dense model ``params``; the victim takes its local step on it and prunes
    its *trained* local model, uploading ŵ = (w − lr·g) ⊙ m, g the gradient at the dense
    model; the server carries it as Δ = ŵ − w = −lr·(g ⊙ m) − w ⊙ (1 − m), so GI's
    target holds −w at every pruned coordinate and SGI removes them by reading m off
    ŵ's zeros (use ``attack_all(..., upload="weights")``).

    Returns the observations, the true images and, per victim, the diagnostics
    ``pruned_grad_share`` = ‖g ⊙ (1 − m)‖² / ‖g‖² (how much of the victim's gradient
    the pruned coordinates hold: the part GI is told is zero under "pruned_model") and
    ``pruned_weight_ratio`` = ‖w ⊙ (1 − m)‖ / ‖lr·g ⊙ m‖ (the size of GI's −w targets
    against the shared update under "alg1"; 0 under "pruned_model").
    """
    if protocol not in A_PROTOCOLS:
        raise ValueError(f"protocol must be one of {A_PROTOCOLS}, got {protocol!r}")
    sq = lambda t: float(sum(jnp.sum(jnp.square(a)) for a in jax.tree_util.tree_leaves(t)))
    unmask = jax.tree_util.tree_map(lambda m: 1.0 - m, mask)
    obs_list, truths, stats = [], [], []
    for idx in victims:
        B = len(idx)
        x, y = jnp.asarray(ds.x_train[idx]), jnp.asarray(ds.y_train[idx])
        g = jax.grad(masked_mean_loss, argnums=1)(apply_fn, params, x, y, jnp.ones(B))
        shared = jax.tree_util.tree_map(lambda a: -lr * a, apply_mask(g, mask))
        if protocol == "pruned_model":
            upd, ratio = shared, 0.0
        else:
            pruned_w = apply_mask(params, unmask)
            upd = jax.tree_util.tree_map(lambda s_, w: s_ - w, shared, pruned_w)
            ratio = (sq(pruned_w) / max(sq(shared), 1e-30)) ** 0.5
        stats.append({"pruned_grad_share": sq(apply_mask(g, unmask)) / max(sq(g), 1e-30),
                      "pruned_weight_ratio": ratio})
        obs = Observation(upd, params, apply_fn, "fedsgd", lr, 1, B, B, y, ds.input_shape,
                          ds.num_classes)
        obs_list.append(restrict(obs, {"labels": True, "batch_size": True}))
        truths.append(np.asarray(x))
    return obs_list, truths, stats


def part_a(args, ds, rows, seed):
    """Attacks on pruned FedSGD uploads at the initial model (or a trained one).

    Every setting of a (model, B) group attacks the same ``args.victims``
    victim batches (paired across schemes, p and the two attacks); rows hold
    the mean over victims and the per-victim values. With
    ``args.a_trained_rounds`` = R > 0 the pruned model of every setting is first
    trained by FedAvg for R rounds (:func:`train_masked`, part B's clients) and
    the victims' uploads are computed at the trained model — the paper's Fig 2
    measures leakage during training, not at initialisation.
    """
    # default_rng(seed), as the partitions' generator: the diagnostics
    # (diagnose_sgi_vs_gi, diagnose_sgi_p_trend, diagnose_grasp_collapse) replay
    # these draws to rebuild part A's probe and victims.
    rng = np.random.default_rng(seed)
    shape = ds.input_shape
    lr = 0.25
    protocol = getattr(args, "a_protocol", "pruned_model")
    probe_idx = rng.choice(len(ds.y_train), 64, replace=False)  # server batch for SNIP/GraSP
    xp, yp = jnp.asarray(ds.x_train[probe_idx]), jnp.asarray(ds.y_train[probe_idx])
    jobs = []  # (model, B, scheme, p)
    Bp = args.p_axis_batch  # the paper's Fig 2(a)-(c): FEMNIST, batch 20
    # --schemes: a p-axis run of some schemes only (a refresh of one scheme's rows). The
    # B and model-size axes are PruneFL's, so they run only with PruneFL. The p-axis
    # group comes first either way, so its victims are the same draws as a full run's.
    schemes = list(getattr(args, "schemes", None) or SCHEMES)
    for s in schemes:
        for p in args.rates:
            jobs.append(("conv2", Bp, s, p))
    if "prunefl" in schemes:
        if 0.3 not in args.rates:  # the reference point of the B and model-size axes
            jobs.append(("conv2", Bp, "prunefl", 0.3))
        for B in args.batch_sizes:
            if B != Bp:
                jobs.append(("conv2", B, "prunefl", 0.3))
        for model in args.model_sizes:
            if model != "conv2" and not getattr(args, "a_trained_rounds", 0):  # trained: Conv-2
                jobs.append((model, Bp, "prunefl", 0.3))
    groups = {}
    for j in jobs:
        groups.setdefault((j[0], j[1]), []).append(j)
    for (model_name, B), group in groups.items():
        model = build_model(model_name, ds.num_classes)
        apply_fn = make_apply_fn(model)
        init_key, init_name = part_a_key(seed, "init", model_name)
        params = init_params(model, shape, init_key)
        d_w = int(np.sum(np.asarray(flatten(prunable(params)))))
        victims = [rng.choice(len(ds.y_train), B, replace=False) for _ in range(args.victims)]
        obs_list, truths, meta = [], [], []
        for i, (_, _, scheme, p) in enumerate(group):
            t0 = time.perf_counter()
            mask_key, mask_name = part_a_key(seed, "mask", model_name, scheme, p)
            mask = scheme_mask(scheme, mask_key, params, p, apply_fn, xp, yp, shape,
                               args.synflow_iterations)
            # "alg1": the victim trains the dense model and prunes afterwards.
            pm = params if protocol == "alg1" else apply_mask(params, mask)
            trained_acc = None
            if getattr(args, "a_trained_rounds", 0):
                if model_name != "conv2":
                    raise ValueError("--a-trained-rounds trains part B's Conv-2 only")
                pm, trained_acc = train_masked(args, ds, pm, mask, seed, args.a_trained_rounds)
            obs, xs, stats = victim_observations(apply_fn, pm, mask, ds, victims, lr, protocol)
            obs_list += obs
            truths += xs
            meta.append((scheme, p, time.perf_counter() - t0, trained_acc, mask_name, stats))
        t0 = time.perf_counter()
        attack_key, attack_name = part_a_key(seed, "attack", model_name, B)
        gi, sg = attack_all(obs_list, with_split(args.attack, args), attack_key,
                            upload="weights" if protocol == "alg1" else "update",
                            mask=sgi_mask_of(args))
        secs = time.perf_counter() - t0
        V = args.victims
        for j, (scheme, p, mask_s, trained_acc, mask_name, stats) in enumerate(meta):
            for name, recs in (("gi", gi), ("sgi", sg)):
                sc = [score(recs[j * V + v].x, truths[j * V + v]) for v in range(V)]
                amis = [score_ami(recs[j * V + v].x, truths[j * V + v]) for v in range(V)]
                rows.append({"part": "A", "dataset": _dataset(args),
                             "partition": _partition(args), "model": model_name,
                             "params": int(sum(l.size for l in jax.tree_util.tree_leaves(params))),
                             "prunable_params": d_w, "base": scheme, "defense": "none", "p": p,
                             "B": B, "attack": name, "lambda_pri": None, "defense_rate": None,
                             "accuracy_round": None, "accuracy_at_round": None,
                             "nmi": float(np.mean([a for a, _ in sc])),
                             "psnr": float(np.mean([b for _, b in sc])), "accuracy": None,
                             "nmi_victims": [a for a, _ in sc], "psnr_victims": [b for _, b in sc],
                             "ami": float(np.mean(amis)), "ami_victims": amis,
                             "attack_loss_victims": [float(recs[j * V + v].loss) for v in range(V)],
                             "victim_indices": [np.asarray(v).tolist() for v in victims],
                             "seed": seed, "init_key": init_name, "mask_key": mask_name,
                             "attack_key": attack_name,
                             "attack_victims_per_call": int(
                                 recs[j * V].extras["victims_per_call"]),
                             "protocol": protocol,
                             "pruned_grad_share_victims": [x["pruned_grad_share"] for x in stats],
                             "pruned_weight_ratio_victims": [x["pruned_weight_ratio"]
                                                             for x in stats],
                             "round": getattr(args, "a_trained_rounds", 0),
                             "trained_rounds": getattr(args, "a_trained_rounds", 0),
                             "trained_accuracy": trained_acc, "mask_seconds": mask_s,
                             "attack_seconds_group": secs})
        print(f"[A] {model_name} B={B}: {len(obs_list)} victims x 2 attacks in {secs:.1f}s",
              flush=True)


def part_a_key(seed: int, *what) -> tuple[jax.Array, str]:
    """Part A's key for ``what`` and the stream's name (recorded in the rows).

    Every key is its own named stream (:func:`fedsim.keys.experiment_key`), so the
    initial model, each (model, scheme, p) mask and each group's attack never share a
    key with each other or with the engine's keys of the trained variant. The same
    (model, scheme, p) gets the same mask in every batch-size group, and the same
    model the same initial weights: the B axis is paired. (Before this, the initial
    model's key ``key(seed)`` was also the first setting's mask key.)
    """
    name = "chu2023/A/" + "/".join(str(w) for w in what)
    return experiment_key(seed, name), name


def _dataset(args) -> str:
    return getattr(args, "dataset", DEFAULT_DATASET)


def _partition(args) -> str:
    return getattr(args, "partition", "dirichlet")


B_MODELS = ("conv2", "vgg11")  # the paper's two (FEMNIST Conv-2, CIFAR-10 VGG-11)


def b_model(args) -> str:
    """The model parts B, C and D train (``--b-model``; Conv-2 in every run before it
    existed, so settings without it mean Conv-2)."""
    return getattr(args, "b_model", None) or "conv2"


def fl_config(args, seed, rounds, observe_rounds, observe_clients=(0, 1)):
    """The FL config of parts A (trained) and B: the dataset's ``args.clients``
    clients (Dirichlet(0.5) label mixes, or a seeded subset of the natural
    writers), each holding ``args.local_batch`` examples."""
    o = {"name": "chu2023", "seed": seed, "data.dataset": _dataset(args),
         "data.image_size": args.image_size, "data.num_clients": args.clients,
         "data.partition": _partition(args), "data.alpha": 0.5,
         "data.examples_per_client": args.local_batch,
         "model.name": b_model(args), "training.rounds": rounds,
         "training.clients_per_round": args.clients_per_round, "training.algorithm": "fedavg",
         "training.local_epochs": 1, "training.batch_size": args.local_batch, "training.lr": args.lr,
         "training.client_parallelism": "loop",
         "training.aggregation": aggregation_of(getattr(args, "upload", "weights")),
         "observer.clients": json.dumps(list(observe_clients)),
         "observer.rounds": json.dumps(observe_rounds),
         "observer.fill": observer_fill_of(args), "output.progress": False,
         "output.plots": False}
    return load_config(None, [f"{k}={v}" for k, v in o.items()])


# FEMNIST Conv-2 of the paper (28×28×1, 62 classes) has N_PAPER parameters; Eq 8's
# L_pri is normalised (its weights sum to 1) while λ_sha·Σα grows with N, so the
# balance point of Eq 6 (withhold j iff |g_j| > λ_sha·N/(2λ_pri) × its layer's mean
# |g|) depends on N. We scale λ_sha by N_PAPER/N to keep the paper's balance.
N_PAPER = 6_603_710

# Part B's steadier accuracy reading: the global model's test accuracy averaged over
# the last LAST_ROUNDS rounds (row key ``accuracy_last5``).
LAST_ROUNDS = 5
# That reading's label in check names and tables.
LAST_READING = f"global model, mean of last {LAST_ROUNDS} rounds"


UPLOADS = ("weights", "update", "split", "sender")


def upload_of(name: str, upload: str) -> str:
    """What defense ``name``'s clients upload under the run's ``--upload`` semantics.

    ``"weights"`` / ``"update"``: every defense alike (see ``--upload``).
    ``"split"``: real pruning (none, Largest, Random, Mix) uploads weights, so a
    pruned weight is a 0 that the server averages in (Alg 1 line 11); Pseudo-Pruning
    and PriPrune upload updates, so a withheld weight is not sent and the server
    keeps its global value there ("the parameters are not actually pruned, but
    retained for local training", §5 Insight 2).
    ``"sender"``: every defense uploads updates (a withheld or pruned weight is a 0
    in Δ) and the server averages each coordinate only over the clients whose
    upload is non-zero there (``training.aggregation = "sender_mean"``, see
    :func:`aggregation_of`), neither averaging a withheld weight in as 0 nor
    counting a withholding client as the global value.
    """
    if upload == "sender":
        return "update"
    if upload != "split":
        return upload
    return "update" if name == "priprune" or name.endswith("_pseudo") else "weights"


def aggregation_of(upload: str) -> str:
    """The server's ``training.aggregation`` under ``--upload`` semantics."""
    return "sender_mean" if upload == "sender" else "mean"


def upload_state(client_states, name):
    """The per-client state of the defense that keeps Pseudo-Pruning's ``local``/``withheld``."""
    up = client_states["upload"]
    if name == "priprune":
        return up
    return up[1]  # chain(masked_upload, defense)


# One jitted argmax(logits) per model function. Eager, a VGG-11 evaluation dispatched
# op by op; jitted, the forward pass is one executable (reused across clients).
_PREDICT = weakref.WeakKeyDictionary()


def _predict_fn(apply_fn):
    if apply_fn not in _PREDICT:
        _PREDICT[apply_fn] = jax.jit(lambda p, x: jnp.argmax(apply_fn(p, x), -1))
    return _PREDICT[apply_fn]


def per_class_accuracy(sim, params, ds):
    """Test accuracy of ``params`` per class [K] (for accuracies on a client's label mix)."""
    predict = _predict_fn(sim.apply_fn)
    pred = []
    for i in range(0, len(ds.y_test), 1000):
        pred.append(np.asarray(predict(params, jnp.asarray(ds.x_test[i:i + 1000]))))
    pred = np.concatenate(pred)
    return np.array([np.mean(pred[ds.y_test == k] == k) for k in range(ds.num_classes)])


def label_mix(sim, cid, num_classes):
    """The client's label distribution h [K] (FEMNIST-style local test data has this mix)."""
    data = sim.client_data(int(cid))
    y, m = np.asarray(data.y), np.asarray(data.mask) > 0
    return np.bincount(y[m], minlength=num_classes) / max(int(m.sum()), 1)


def client_model_accuracy(sim, state, name, ds, rounds, max_clients=20, mask=None):
    """Accuracies of the models the clients train from next round.

    With Pseudo-Pruning (and PriPrune) a client's model is
    w_g ⊙ (1 − m̂) + w_local ⊙ m̂ (its withheld weights stay on the client,
    §5 Insight 2), times the global ``mask`` when one is given (``pseudo_start``
    masked); without it the client restarts from the global model, so
    its model is the global one. Evaluated for the first ``max_clients``
    clients (by id) that took part in some round — the same clients for every
    defense (the cohorts depend on the seed only). Returns ``global``: the
    mean test accuracy of the client models on the whole test set; ``local``:
    their mean accuracy on each client's own label mix (Σ_k h_k a_k, a_k the
    per-class test accuracy: the client's local test data in a FEMNIST-style
    per-writer split, where the paper measures accuracy); ``global_local``:
    the global model on the same label mixes; ``majority_local``: the mean over the
    same clients of max_k h_k, what a model that always predicts the client's most
    common label scores on that reading (:func:`majority_label_baseline`).
    """
    from defenses.pruning.masks import pseudo_pruning_begin
    pseudo = name == "priprune" or name.endswith("_pseudo")
    ids = sorted({int(c) for r in range(rounds) for c in sim.cohort(r)})[:max_clients]
    g_class = per_class_accuracy(sim, state.params, ds)
    st = upload_state(state.client_states, name) if pseudo else None
    accs, local, glob_local = [], [], []
    for c in ids:
        h = label_mix(sim, c, ds.num_classes)
        glob_local.append(float(h @ g_class))
        if pseudo:
            cs = jax.tree_util.tree_map(lambda a: a[c], st)
            start, _ = pseudo_pruning_begin(state.params, cs)
            if mask is not None:
                start = apply_mask(start, mask)
            accs.append(sim.evaluate(start)[0])
            local.append(float(h @ per_class_accuracy(sim, start, ds)))
        else:
            local.append(glob_local[-1])
    acc_global = float(np.mean(accs)) if pseudo else sim.evaluate(state.params)[0]
    return {"global": acc_global, "local": float(np.mean(local)),
            "global_local": float(np.mean(glob_local)), "ids": ids,
            "majority_local": majority_label_baseline(sim, ids, ds.num_classes)}


#: The own-label-mix reading's floor: Σ_k h_k·a_k of a model at chance on the whole test
#: set can reach max_k h_k (always predict the client's most common label). The Largest
#: (Pseudo) recovery check on that reading requires the recovered client models to beat
#: the mean of max_k h_k over the evaluated clients by this margin (1 point); at or below
#: it the reading cannot tell a recovered model from a constant predictor.
OWN_MIX_MARGIN = 0.01


def majority_label_baseline(sim, ids, num_classes) -> float:
    """Mean over clients ``ids`` of max_k h_k (h: :func:`label_mix`): the own-label-mix
    accuracy of a model that always predicts each client's most common label."""
    return float(np.mean([label_mix(sim, c, num_classes).max() for c in ids]))


def add_majority_baseline(rows, settings, ds) -> None:
    """Give the part B-D rows of one run that lack it ``majority_label_local_accuracy``
    (:func:`majority_label_baseline` over the row's ``client_model_ids``), recomputed from
    the run's recorded ``settings``: the clients' label mixes are fixed by the seed and the
    data settings (part B's :func:`fl_config`), no training is involved. Rows recorded
    since the field exists keep their own value."""
    need = [r for r in rows if r["part"] in ("B", "C", "D") and r.get("client_model_ids")
            and "majority_label_local_accuracy" not in r]
    if not need:
        return
    seeds = {r.get("fl_seed", settings["seed"]) for r in need}
    if seeds != {settings["seed"]}:
        raise ValueError(f"rows of FL seed(s) {sorted(seeds)} in a run of seed {settings['seed']}")
    R = settings["rounds"]
    sim = Simulation(fl_config(argparse.Namespace(**settings), settings["seed"], R,
                               sorted({0, R // 2, R - 1})), dataset=ds)
    cache = {}
    for r in need:
        ids = tuple(r["client_model_ids"])
        if ids not in cache:
            cache[ids] = majority_label_baseline(sim, ids, ds.num_classes)
        r["majority_label_local_accuracy"] = cache[ids]


PART_B_ATTACK_STREAM = "chu2023/B/attack"


def part_b_attack_key(seed: int) -> jax.Array:
    """Part B's attack key: stream ``chu2023/B/attack`` of the seed (before Nov 25
    2026 ``key(seed + 7)``, the root key of a run with seed + 7)."""
    return experiment_key(seed, PART_B_ATTACK_STREAM)


#: What a Pseudo-Pruning (and PriPrune) client's start model holds at a weight it
#: withheld that the server has pruned since (PruneFL re-prunes): ``masked`` — 0,
#: a pruned weight is in no model a client trains (the engine's pruned FL,
#: ``fedsim.hooks.mask_around``, since Nov 27 2026); ``kept`` — its old local value,
#: which its masked gradient then never moves (part B's runs before that).
PSEUDO_STARTS = ("masked", "kept")


def pseudo_start_of(args) -> str:
    """``args.pseudo_start``; ``kept`` for settings recorded before the option existed."""
    return getattr(args, "pseudo_start", "kept")


def observer_fill_of(args) -> str:
    """``args.observer_fill`` (the engine's ``observer.fill``); ``sorted_cut`` for
    settings recorded before the option existed, as those runs' cohorts were made."""
    return getattr(args, "observer_fill", "sorted_cut")


def train_b(args, ds, cfg, name):
    """Part B's federation under defense ``name``: PruneFL (p = 0.3, re-pruned
    ``args.reconfigs`` times), the defense on the uploads, ``args.rounds`` rounds,
    the global mask applied after each (Alg 1 line 11). With Pseudo-Pruning, the
    start model follows ``pseudo_start_of(args)`` (:data:`PSEUDO_STARTS`).

    Returns ``{"state", "sim", "mask", "observed", "acc_by_round", "rates",
    "n_params"}``: the final state and the simulation that ran the last round,
    the last PruneFL mask, the observer's records, the global model's test
    accuracy after each round, and (PriPrune) client 0's withheld fraction after
    each round. Deterministic in ``cfg`` (its seed): ``diagnose_largest_collapse``
    rebuilds part B's models through it.
    """
    R = args.rounds
    reconfig = [int(R * k / args.reconfigs) for k in range(args.reconfigs)]
    d = defense_factory(name, args)
    state, mask, sim, observed, k, n_params = None, None, None, [], 0, None
    rates, acc_by_round = [], []
    for r in range(R):
        if r in reconfig:
            k += 1
            if sim is None:
                sim0 = Simulation(cfg, dataset=ds)
                params = sim0.init_state().params
                n_params = sum(l.size for l in jax.tree_util.tree_leaves(params))
                mask = initial_mask("prunefl", None, params, 0.3)
            mask = prunefl_reprune(params if state is None else state.params, mask, 0.3, k,
                                   args.reconfigs)
            kw = {}
            if d == "priprune":
                hp = priprune_hp(args, n_params)
                defs = {"layer": masked_gradient(mask), "upload": priprune_defense(hp)}
                kw["client_update_factory"] = priprune_client_update(hp)
            else:
                defs = {"layer": masked_gradient(mask),
                        "upload": chain(*([masked_upload(mask)] + ([d] if d is not None else [])))}
            if pseudo_start_of(args) == "masked":  # as the engine's pruned FL does
                defs["upload"] = mask_start(mask, defs["upload"])
            sim = Simulation(cfg, dataset=ds, defenses=defs, **kw)
            if state is None:
                state = sim.init_state()
            state = state._replace(params=apply_mask(state.params, mask))
        state, res = sim.run_round(state, r)
        state = state._replace(params=apply_mask(state.params, mask))  # Alg 1 line 11
        observed.extend(res.observed)
        acc_by_round.append(sim.evaluate(state.params)[0])
        if d == "priprune":
            cs = jax.tree_util.tree_map(lambda s: s[0], state.client_states["upload"])
            rates.append(float(defense_rate(cs["withheld"])))
    return {"state": state, "sim": sim, "mask": mask, "observed": observed,
            "acc_by_round": acc_by_round, "rates": rates, "n_params": n_params}


def part_b(args, ds, rows, seed):
    """Pruned FL with PruneFL (p = 0.3) and the defenses (Fig 4, Fig 5, Fig 2(d))."""
    R = args.rounds
    observe = sorted({0, R // 2, R - 1})
    cfg = fl_config(args, seed, R, observe)
    pending = []
    for name in args.defenses:
        t0 = time.perf_counter()
        run = train_b(args, ds, cfg, name)
        state, sim, observed = run["state"], run["sim"], run["observed"]
        rates, acc_by_round = run["rates"], run["acc_by_round"]
        acc = acc_by_round[-1]
        # The final round's accuracy of a 30-round non-IID run moves by points from one
        # round to the next; the mean over the last LAST_ROUNDS rounds is the steadier
        # reading (as reproduce_sun2021 reports accuracy).
        acc_last = float(np.mean(acc_by_round[-LAST_ROUNDS:]))
        cm = client_model_accuracy(sim, state, name, ds, R, mask=(
            run["mask"] if pseudo_start_of(args) == "masked" else None))
        cacc = cm["global"]
        mean_rate = None
        if name == "priprune":
            st = state.client_states["upload"]
            mean_rate = float(np.mean([float(defense_rate(jax.tree_util.tree_map(
                lambda a: a[c], st["withheld"]))) for c in cm["ids"]]))
        train_s = time.perf_counter() - t0
        # Attacked: both observed clients in the last round; client 0 in the
        # earlier observed rounds for the rounds axis (none and PriPrune only).
        for o in observed:
            ob = o.observation
            if ob.round == R - 1 or (ob.client_id == 0 and name in ("none", "priprune")
                                     and getattr(args, "rounds_axis", True)):
                pending.append((name, (acc, acc_last, acc_by_round), cm, train_s, rates,
                                mean_rate, o))
        print(f"[B] {name} ({upload_of(name, args.upload)} uploads): acc {acc:.4f} client-model acc {cacc} "
              f"local-mix acc: client models {cm['local']}, global {cm['global_local']:.4f} "
              f"({train_s:.0f}s train)", flush=True)
    # One vmapped attack over every upload (one compile per attack), paired keys.
    obs = [restrict(p[-1].observation, {"labels": True, "batch_size": True, "local_steps": True})
           for p in pending]
    t1 = time.perf_counter()
    akey = part_b_attack_key(seed)
    # SGI reads the mask off the weights the server receives (Alg 2 line 3; one
    # call with each victim's upload semantics keeps every victim's attack key);
    # GI attacks ŵ − w_g as it is (Alg 1 line 8).
    uploads = [upload_of(p[0], args.upload) for p in pending]
    attack_b = with_split(args.attack_b, args)
    sg = sgi.run_many(obs, {**attack_b, "mask": sgi_mask_of(args)}, akey, uploads=uploads)
    gi = inverting_gradients.run_many(obs, attack_b, akey)
    att_s = time.perf_counter() - t1
    print(f"[B] attacks: {len(obs)} victims x 2 attacks in {att_s:.0f}s", flush=True)
    for (name, (acc, acc_last, acc_by_round), cm, train_s, rates, mean_rate, o), ob, up, rs, rg \
            in zip(pending, obs, uploads, sg, gi):
        # The fraction of coordinates the server receives as 0 (pruned or withheld).
        received = ob.update if up == "update" else jax.tree_util.tree_map(
            jnp.add, ob.update, ob.params)
        zf = float(np.mean(np.asarray(flatten(received)) == 0))
        for att, rec in (("sgi", rs), ("gi", rg)):
            n, ps = score(rec.x, o.x)
            rows.append({"part": "B", "dataset": _dataset(args), "partition": _partition(args),
                         "model": b_model(args),
                         "base": "prunefl", "defense": name, "p": 0.3, "B": args.local_batch,
                         "attack": att, "nmi": n, "psnr": ps, "accuracy": acc,
                         # ``accuracy`` is the final round's (R - 1); the attacked round's
                         # own is ``accuracy_at_round`` (see ROW_FIELDS).
                         "accuracy_round": len(acc_by_round) - 1,
                         "accuracy_at_round": acc_by_round[ob.round],
                         "lambda_pri": args.lambda_pri if name == "priprune" else None,
                         "ami": score_ami(rec.x, o.x),
                         "accuracy_last5": acc_last, "accuracy_by_round": acc_by_round,
                         "upload": up, "upload_semantics": args.upload,
                         "aggregation": aggregation_of(args.upload),
                         "client_model_accuracy": cm["global"], "client_model_ids": cm["ids"],
                         "client_model_local_accuracy": cm["local"],
                         "majority_label_local_accuracy": cm["majority_local"],
                         "global_local_accuracy": cm["global_local"],
                         "round": ob.round, "client_id": ob.client_id,
                         "upload_zero_fraction": zf, "attack_loss": float(rec.loss),
                         "attack_victims_per_call": int(rec.extras["victims_per_call"]),
                         "attack_key": PART_B_ATTACK_STREAM, "fl_seed": seed,
                         "priprune_defense_rate_client0": rates if name == "priprune" else None,
                         "priprune_defense_rate_mean": mean_rate,
                         "defense_rate": (args.defense_rate if name not in ("none", "priprune")
                                          else None),
                         "train_seconds": train_s, "attack_seconds_all": att_s})


def part_c(args, ds, rows, seed):
    """PriPrune over the paper's λ_pri grid {1, 10, 15} (10 is part B's run; Fig 5(a)).

    Everything else as part B (same seed, clients, attack key); last round only.
    """
    import copy
    for lp in args.lambda_pri_grid:
        a2 = copy.copy(args)
        a2.lambda_pri, a2.defenses, a2.rounds_axis = lp, ["priprune"], False
        sub = []
        part_b(a2, ds, sub, seed)
        for r in sub:
            r.update(part="C", lambda_pri=lp)
        rows.extend(sub)


def part_d(args, ds, rows, seed):
    """Largest and Largest (Pseudo) at the other defense rates (Fig 4(d): p̂ axis).

    Everything else as part B (same seed, clients, attack key; "none" is part
    B's run); last round only. Rows carry ``defense_rate``.
    """
    import copy
    for rate in args.defense_rate_grid:
        a2 = copy.copy(args)
        a2.defense_rate, a2.defenses, a2.rounds_axis = rate, ["largest", "largest_pseudo"], False
        sub = []
        part_b(a2, ds, sub, seed)
        for r in sub:
            r.update(part="D")
        rows.extend(sub)


def priprune_hp(args, n_params):
    """PriPrune hyper-parameters of this run (λ_sha scaled by N_PAPER/N, see N_PAPER)."""
    return PriPruneConfig(lambda_acc=args.lambda_acc, lambda_pri=args.lambda_pri,
                          lambda_sha=args.lambda_sha * N_PAPER / n_params, tau=args.tau,
                          alpha_lr=args.alpha_lr, alpha_init=args.alpha_init,
                          upload=upload_of("priprune", args.upload))


def defense_factory(name, args):
    p, up = args.defense_rate, upload_of(name, args.upload)
    table = {
        "none": lambda: None,
        "largest": lambda: prune_largest(p, upload=up), "random": lambda: prune_random(p, upload=up),
        "mix": lambda: prune_mix(p / 2, p / 2, upload=up),
        "largest_pseudo": lambda: prune_largest(p, pseudo=True, upload=up),
        "random_pseudo": lambda: prune_random(p, pseudo=True, upload=up),
        "mix_pseudo": lambda: prune_mix(p / 2, p / 2, pseudo=True, upload=up),
        "priprune": lambda: "priprune",
    }
    if name not in table:
        raise ValueError(f"unknown defense {name!r}; allowed: {', '.join(table)}")
    return table[name]()


def bound_table(ds, seed, d_star=8, n_examples=256, chunk=16):
    """Thm 1 / Cor 1 (defenses.bounds.priprune_leakage_bound) per p, B and T.

    Σ is the empirical covariance of the d* gradient coordinates with the
    largest mean |g| of per-example gradients at part B's initial Conv-2 model
    (the engine's init key for ``seed``; our choice of "the d*-dimensional
    sub-vector"; the paper gives no recipe).
    """
    from defenses.bounds import priprune_leakage_bound
    model = build_model("conv2", ds.num_classes)
    apply_fn = make_apply_fn(model)
    params = init_params(model, ds.input_shape,
                         jax.random.fold_in(jax.random.key(seed), ENGINE_INIT))
    idx = numpy_generator(seed, "chu2023/bound/examples").choice(len(ds.y_train), n_examples,
                                                                 replace=False)
    x, y = jnp.asarray(ds.x_train[idx]), jnp.asarray(ds.y_train[idx])
    per_ex = jax.jit(jax.vmap(lambda xi, yi: flatten(jax.grad(masked_mean_loss, argnums=1)(
        apply_fn, params, xi[None], yi[None], jnp.ones(1))), in_axes=(0, 0)))
    mean_abs = 0.0
    for i in range(0, n_examples, chunk):
        mean_abs = mean_abs + jnp.sum(jnp.abs(per_ex(x[i:i + chunk], y[i:i + chunk])), 0)
    sel = jnp.argsort(-mean_abs)[:d_star]
    g = np.concatenate([np.asarray(per_ex(x[i:i + chunk], y[i:i + chunk])[:, sel])
                        for i in range(0, n_examples, chunk)])
    cov = np.cov(g.astype(np.float64), rowvar=False)
    out = []
    for p in (0.1, 0.3, 0.5, 0.7, 0.9):
        for B in (1, 4, 8, 20):
            for T in (1, 20):
                out.append({"p": p, "B": B, "T": T, "d_star": d_star,
                            "bound_bits": priprune_leakage_bound(p, B, cov, rounds=T)})
    logdet = float(np.linalg.slogdet(cov)[1])
    return {"rows": out, "logdet_sigma": logdet, "d_star": d_star,
            "n_examples": n_examples, "seed": seed, "examples_stream": "chu2023/bound/examples",
            "bound": lambda p, B, T: priprune_leakage_bound(p, B, logdet=logdet, dim=d_star,
                                                            rounds=T)}


def other_b_runs(out: Path, stem: str = "chu2023", ds=None) -> list[dict]:
    """Part-B runs beside the main one: other seeds (``<stem>_B_seed<N>.json``) and other
    upload semantics (``<stem>_B_<upload>_uploads[_seed<N>].json``), each with its checks.
    A run made with ``--tag`` is a side study, not a replication, and is left out. With
    the dataset ``ds``, rows lacking them get the majority-label baseline
    (:func:`add_majority_baseline`) and the :data:`ROW_FIELDS` before the checks."""
    files = sorted(out.glob(f"{stem}_B_seed*.json")) + sorted(out.glob(f"{stem}_B_*_uploads*.json"))
    runs = []
    for f in files:
        o = json.loads(f.read_text())
        if o["settings"].get("tag"):  # a --tag side run (fig4_runs, λ/rounds studies):
            continue                  # other defenses or settings, not a replication
        if b_model(argparse.Namespace(**o["settings"])) != "conv2":
            continue                  # another model (--b-model): not a replication either
        if ds is not None:
            add_majority_baseline(o["rows"], o["settings"], ds)
        complete_row_fields(o["rows"], o["settings"])
        runs.append({"file": f.name, "seed": o["seed"], "commit": o.get("commit"),
                     "seconds": o["seconds"], "upload": o["settings"].get("upload", "weights"),
                     "settings": o["settings"], "rows": o["rows"],
                     "checks": acceptance_checks(o["rows"])})
    return runs


FIG4_DEFENSES = ("largest", "random", "mix")


def fig4_runs(out: Path, stem: str = "chu2023", ds=None) -> list[dict]:
    """Part-B side runs of the other fixed-rate defenses (``--parts B --defenses
    none,random,mix,random_pseudo,mix_pseudo --tag fig4``: ``<stem>_B*_fig4.json``);
    with ``ds``, completed as in :func:`other_b_runs`."""
    runs = []
    for f in sorted(out.glob(f"{stem}_B*_fig4.json")):
        o = json.loads(f.read_text())
        if b_model(argparse.Namespace(**o["settings"])) != "conv2":
            continue  # read against the main (Conv-2) run's rows: same model only
        if ds is not None:
            add_majority_baseline(o["rows"], o["settings"], ds)
        complete_row_fields(o["rows"], o["settings"])
        runs.append({"file": f.name, "seed": o["seed"], "commit": o.get("commit"),
                     "seconds": o["seconds"], "upload": o["settings"].get("upload", "weights"),
                     "settings": o["settings"], "rows": o["rows"]})
    return runs


def pseudo_recovery(rows, real: str, last: int, key: str):
    """``(none, real, real_pseudo, recovered)`` on one accuracy reading: the share of the
    real defense's accuracy loss that its Pseudo-Pruning version wins back; ``recovered``
    is None where the real defense lost nothing (or a value is missing)."""
    get = lambda n: _b_mean(rows, n, "sgi", key, last)
    base, lo, ps = get("none"), get(real), get(f"{real}_pseudo")
    if None in (base, lo, ps):
        return None
    return base, lo, ps, ((ps - lo) / (base - lo) if base - lo > 0 else None)


def majority_baseline_of(rows, last, part="B", rate=None):
    """The majority-label baseline of a run's own-label-mix reading (mean of the rows'
    ``majority_label_local_accuracy`` in round ``last``), or None where not recorded."""
    sel = [r["majority_label_local_accuracy"] for r in rows if r["part"] == part
           and r["round"] == last and (rate is None or r.get("defense_rate") == rate)
           and r.get("majority_label_local_accuracy") is not None]
    return float(np.mean(sel)) if sel else None


def majority_text(rows, last) -> str:
    """The markdown's note on the own-label-mix reading's majority-label baseline."""
    maj = majority_baseline_of(rows, last)
    if maj is None:
        return ("The own-label-mix reading's majority-label baseline is not recorded in "
                "these rows, so the Largest (Pseudo) check on that reading is not evaluable.")
    return (f"Majority-label baseline of the own-label-mix reading: {maj:.4f}, the mean over "
            "the evaluated clients of max_k h_k (h the client's label mix), which a model "
            "that always predicts the client's most common label scores there, even at "
            "chance (0.10) on the whole test set. The Largest (Pseudo) recovery check on that "
            f"reading needs its client models {100 * OWN_MIX_MARGIN:g} point above it; at or "
            "below it the check FAILS as not evaluable (the other readings' checks are "
            "unchanged).")


def own_mix_header(rows, last, part="B", rate=None) -> str:
    """The own-label-mix column's header, with the run's majority-label baseline."""
    maj = majority_baseline_of(rows, last, part, rate)
    return "client-model acc, own label mix" + (
        "" if maj is None else f" (majority-label baseline {maj:.4f})")


def fig4_lines(result) -> list[str]:
    """Fig 4: every fixed-rate defense pruning (Largest / Random / Mix) with and without
    Pseudo-Pruning. A side run has its own ``none`` baseline. Where it has the main
    part-B run's seed, upload semantics and settings, the main run's ``none``, Largest and
    Largest (Pseudo) rows are shown beside it (marked "main run"); the two ``none`` rows
    are the same federation, so any difference between them is the machines' float
    rounding carried through training. Each real defense's loss is read against the
    ``none`` of its own run."""
    lines = []
    main_rows = [r for r in result["rows"] if r["part"] == "B"]
    main_settings = result.get("settings_B", {})
    fmt = lambda v: "—" if v is None else f"{v:.4f}"
    readings = (("global", "accuracy"), ("client models", "client_model_accuracy"),
                ("own label mix", "client_model_local_accuracy"),
                (f"global, last {LAST_ROUNDS} rounds", "accuracy_last5"))
    for o in result.get("fig4_B", []):
        rows = [r for r in o["rows"] if r["part"] == "B"]
        last = max(r["round"] for r in rows)
        same = (o["seed"] == result["seed"]
                and _same_b_settings(o["settings"], main_settings,
                                     skip_extra=("defenses", "tag")) == "yes")
        runs = [("", rows)]
        if same:
            main = [r for r in main_rows if r["defense"] in ("none", "largest", "largest_pseudo")]
            if main:
                runs.append((" (main run)", main))
        lines += ["", f"## Fig 4: fixed-rate defense pruning, with and without Pseudo-Pruning "
                  f"(seed {o['seed']}, {o['upload']} uploads; {o['file']}, commit "
                  f"{o.get('commit')}, {o['seconds']:.0f} s)", "",
                  f"Part B's federation and attack (PruneFL p = 0.3, p̂ = "
                  f"{o['settings'].get('defense_rate')}; Mix: p̂/2 largest + p̂/2 random). "
                  + ("Rows marked \"main run\" are the main part-B run's (same seed and "
                     "settings; its commit is in the header); the two `none` rows are the "
                     "same federation, so their difference is "
                     "float rounding of two machines carried through 30 rounds. Each real "
                     "defense's loss is read against its own run's `none`."
                     if len(runs) > 1 else "Largest is not in this run and the main part-B run "
                     "differs in seed or settings, so it is not shown."), "",
                  f"| defense | global acc | global acc, last {LAST_ROUNDS} rounds | "
                  f"client-model acc | {own_mix_header(rows, last)} | SGI NMI | SGI PSNR | "
                  "GI NMI | GI PSNR | upload zeros |", "|---|---|---|---|---|---|---|---|---|---|"]
        order = ["none"] + [n for d in FIG4_DEFENSES for n in (d, f"{d}_pseudo")]
        for tag, rs in runs:
            for name in [n for n in order if any(r["defense"] == n for r in rs)]:
                m = lambda att, key: _b_mean(rs, name, att, key, last)
                lines.append(f"| {name}{tag} | {fmt(m('sgi', 'accuracy'))} | "
                             f"{fmt(m('sgi', 'accuracy_last5'))} | "
                             f"{fmt(m('sgi', 'client_model_accuracy'))} | "
                             f"{fmt(m('sgi', 'client_model_local_accuracy'))} | "
                             f"{fmt(m('sgi', 'nmi'))} | {m('sgi', 'psnr'):.2f} | "
                             f"{fmt(m('gi', 'nmi'))} | {m('gi', 'psnr'):.2f} | "
                             f"{m('sgi', 'upload_zero_fraction'):.3f} |")
        lines += same_scores_lines(rows, last)
        lines += ["", "Share of each real defense's accuracy loss that its Pseudo-Pruning "
                  "version recovers, per accuracy reading (none → real → pseudo):", ""]
        for real in FIG4_DEFENSES:
            rs = next((rs for _, rs in runs if any(r["defense"] == real for r in rs)), None)
            parts = []
            for label, key in readings:
                rec = None if rs is None else pseudo_recovery(rs, real, last, key)
                if rec is None:
                    continue
                base, lo, ps, share = rec
                maj = (majority_baseline_of(rs, last) if key == "client_model_local_accuracy"
                       else None)
                parts.append(f"{label} {base:.4f} → {lo:.4f} → {ps:.4f} ("
                             + ("no loss" if share is None else f"{share:.0%}")
                             + ("" if maj is None else
                                f"; majority-label baseline {maj:.4f}, "
                                + (f"not beaten by {100 * OWN_MIX_MARGIN:g} point: not "
                                   "evaluable" if ps < maj + OWN_MIX_MARGIN else "beaten"))
                             + ")")
            if parts:
                lines.append(f"- {real}: " + "; ".join(parts))
    return lines


def semantics_summary(result) -> list[str]:
    """One row per part-B run (main, other seeds, other upload semantics): its PriPrune and
    Largest (Pseudo) verdicts per accuracy reading."""
    runs = [{"file": f"{result.get('stem', 'chu2023')}_B.json (main)", "seed": result["seed"],
             "upload": result.get("settings_B", result.get("settings", {})).get("upload", "weights"),
             "checks": [c for c in result.get("checks", []) if "part D" not in c["check"]]}]
    runs += result.get("other_seeds_B", [])
    runs = [r for r in runs if any(c["check"].startswith(("PriPrune", "Largest")) for c in r["checks"])]
    if not runs:
        return []
    short = {"global model, whole test set": "global", "client models, whole test set": "client",
             "client models, own label mix": "own mix",
             LAST_READING: f"global last {LAST_ROUNDS}"}

    def verdicts(checks, start):
        out = []
        for label, tag in short.items():
            c = next((c for c in checks if c["check"].startswith(start)
                      and c["check"].endswith(f"({label})") and "part D" not in c["check"]), None)
            out.append("—" if c is None else "PASS" if c["pass"] else
                       "FAIL (n/e)" if c["detail"].startswith("not evaluable") else "FAIL")
        return out

    lines = ["", "## Part B verdicts by upload semantics and seed", "",
             "Upload semantics: `weights` — every client uploads masked weights and the server "
             "averages a withheld weight as 0 (Alg 1 line 11 as printed); `update` — masked "
             "updates, a withheld weight keeps its global value; `split` — real pruning (none, "
             "Largest) uploads weights, Pseudo-Pruning and PriPrune leave withheld weights out "
             "(update); `sender` — every client uploads updates and the server averages "
             "each coordinate over the clients that sent it (sender_mean). Each cell: global model / "
             "client models / client models on their own label mix / global model averaged "
             f"over the last {LAST_ROUNDS} rounds (— where a run predates that reading). "
             "FAIL (n/e): Largest (Pseudo)'s client models do not beat the own-label-mix "
             f"reading's majority-label baseline by {100 * OWN_MIX_MARGIN:g} point, so that "
             "reading cannot tell them from always predicting each client's most common "
             "label.", "",
             "| run | upload | seed | PriPrune: privacy + accuracy within 1 point | "
             "Largest (Pseudo) recovers ≥ 50 % |", "|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: ({"weights": 0, "update": 1, "split": 2, "sender": 3}.get(r["upload"], 4),
                                         r["seed"])):
        lines.append(f"| {r['file']} | {r['upload']} | {r['seed']} | "
                     f"{' / '.join(verdicts(r['checks'], 'PriPrune'))} | "
                     f"{' / '.join(verdicts(r['checks'], 'Largest (Pseudo)'))} |")
    return lines


def pooling_variant(settings: dict) -> tuple:
    """What of a part-B run's recorded settings keeps it from being pooled with another
    seed of the same upload semantics: ((name, value), ...) of its Pseudo-Pruning start
    model, observer fill, SGI mask and rounds (absent options: the values of the runs
    recorded before them)."""
    ns = argparse.Namespace(**settings)
    return (("start", pseudo_start_of(ns)), ("fill", observer_fill_of(ns)),
            ("SGI mask", sgi_mask_of(ns)), ("rounds", settings.get("rounds")))


def priprune_seed_effects(rows) -> dict | None:
    """PriPrune minus PruneFL in one part-B run: accuracy per reading (points) and the
    relative SGI NMI gain; None when the run has no PriPrune or no PruneFL rows."""
    b = [r for r in rows if r["part"] == "B"]
    if not b:
        return None
    last = max(r["round"] for r in b)
    m = lambda d, key: _b_mean(rows, d, "sgi", key, last)
    if m("none", "accuracy") is None or m("priprune", "accuracy") is None:
        return None
    out = {"nmi_gain": (m("none", "nmi") - m("priprune", "nmi")) / m("none", "nmi")}
    for tag, key in (("global", "accuracy"), ("client", "client_model_accuracy"),
                     ("own_mix", "client_model_local_accuracy"), ("global_last5", "accuracy_last5")):
        a0, a1 = m("none", key), m("priprune", key)
        out[tag] = None if None in (a0, a1) else 100.0 * (a1 - a0)
    return out


def seed_pooled_lines(result) -> list[str]:
    """Per upload semantics with runs at two or more seeds: PriPrune − PruneFL pooled over
    the seeds (mean and sample std of the per-seed differences). The acceptance rule stays
    per run (the verdict table above); this says how far the per-seed verdicts are from
    the threshold given the seed-to-seed spread, which in this small setting is large."""
    main_settings = result.get("settings_B", result.get("settings", {}))
    runs = [(main_settings.get("upload", "weights"), pooling_variant(main_settings),
             result["seed"], result["rows"])]
    runs += [(o.get("upload", "weights"), pooling_variant(o.get("settings", {})), o["seed"],
              o["rows"]) for o in result.get("other_seeds_B", [])]
    # Runs of another Pseudo-Pruning start model, observer fill, SGI mask or number of
    # rounds train or attack otherwise: pooled apart, each label naming what varies.
    varying = [i for i in range(len(runs[0][1])) if len({v[i] for _, v, _, _ in runs}) > 1]
    by_upload = {}
    for upload, variant, seed, rows in runs:
        eff = priprune_seed_effects(rows)
        if eff is not None:
            label = upload + "".join(f", {variant[i][1]} {variant[i][0]}" for i in varying)
            by_upload.setdefault(label, {})[seed] = eff
    pooled = {u: e for u, e in by_upload.items() if len(e) >= 2}
    if not pooled:
        return []

    def stat(vals):
        vals = [v for v in vals if v is not None]
        if not vals:
            return "—"
        within = f"{sum(v >= -1.0 for v in vals)}/{len(vals)}"
        if len(vals) < 2:
            return f"{np.mean(vals):+.1f} ({within})"
        # 95 % t interval of the mean paired difference (seeds as independent replicates).
        from scipy import stats
        mean, sd = float(np.mean(vals)), float(np.std(vals, ddof=1))
        half = stats.t.ppf(0.975, len(vals) - 1) * sd / np.sqrt(len(vals))
        return f"{mean:+.1f} ± {sd:.1f} ({within}; 95 % CI {mean - half:+.1f} to {mean + half:+.1f})"

    lines = ["", "## PriPrune − PruneFL pooled over seeds", "",
             "Per upload semantics (and Pseudo-Pruning start model, observer fill, SGI mask "
             "or rounds, where the runs differ in them) with runs at two or more seeds: mean ± sample std over the "
             "seeds of PriPrune's accuracy minus PruneFL's, in points, and in brackets the "
             "seeds within the 1-point rule and the 95 % t interval of the mean difference; "
             "SGI NMI gain as mean ± sample std (relative). The acceptance "
             "checks stay per run (verdict table above); this shows how the per-seed verdicts "
             "sit against the seed-to-seed spread.", "",
             "| upload | seeds | global model | client models | client models, own label mix | "
             f"global model, last {LAST_ROUNDS} rounds | SGI NMI gain |", "|---|---|---|---|---|---|---|"]
    order = {"weights": 0, "update": 1, "split": 2, "sender": 3}
    for upload in sorted(pooled, key=lambda u: (order.get(u.split(",")[0], 4), u)):
        effs = pooled[upload]
        gains = [e["nmi_gain"] for e in effs.values()]
        lines.append(f"| {upload} | {', '.join(str(s) for s in sorted(effs))} | "
                     f"{stat([e['global'] for e in effs.values()])} | "
                     f"{stat([e['client'] for e in effs.values()])} | "
                     f"{stat([e['own_mix'] for e in effs.values()])} | "
                     f"{stat([e['global_last5'] for e in effs.values()])} | "
                     f"{np.mean(gains):+.1%} ± {np.std(gains, ddof=1):.1%} |")
    return lines


def same_gi_sgi_scores(rows, last) -> list[str]:
    """Part-B defenses whose GI and SGI reconstructions scored the same NMI and PSNR at
    every client attacked in round ``last``. Equal scores to the last digit mean the
    same reconstruction: the two attacks' different targets did not steer it (for
    real Largest the attacked model has no input gradient left, see
    ``benchmarks/diagnose_largest_collapse.py``)."""
    out = []
    for name in dict.fromkeys(r["defense"] for r in rows if r["part"] == "B"):
        pairs = {}
        for r in rows:
            if r["part"] == "B" and r["defense"] == name and r["round"] == last:
                pairs.setdefault(r["client_id"], {})[r["attack"]] = (r["nmi"], r["psnr"])
        if pairs and all(len(v) == 2 and v["gi"] == v["sgi"] for v in pairs.values()):
            out.append(name)
    return out


def same_scores_lines(rows, last) -> list[str]:
    """A markdown note naming the defenses of :func:`same_gi_sgi_scores`, if any."""
    same = same_gi_sgi_scores(rows, last)
    if not same:
        return []
    return ["", f"GI and SGI scored the same NMI and PSNR at every attacked client for: "
            f"{', '.join(same)}. Equal scores mean the same reconstruction, so the two "
            "attacks' different targets did not steer it: these NMI/PSNR measure the TV "
            "prior's image, not a leak. For real Largest at seed 0, "
            "[largest_collapse.md](largest_collapse.md) shows why: the global model has almost "
            "no live units left and gives the matching term no input gradient."]


def other_seed_tables(result) -> list[str]:
    """Markdown for part B re-run at other seeds or upload semantics (not in the main rows)."""
    lines = []
    for o in result.get("other_seeds_B", []):
        rows = o["rows"]
        last = max(r["round"] for r in rows)
        what = ("replication" if o.get("upload", "weights") == "weights"
                else f"{o['upload']} uploads")
        lines += ["", f"## B at seed {o['seed']}, {o.get('upload', 'weights')} uploads ({what}; "
                  f"{o.get('file', '')}, commit {o.get('commit')}, "
                  f"{o['seconds']:.0f} s; same settings: "
                  f"{_same_b_settings(o['settings'], result.get('settings_B', {}))})", "",
                  f"| defense | global acc | global acc, last {LAST_ROUNDS} rounds | client-model acc | "
                  f"{own_mix_header(rows, last)} | "
                  "SGI NMI | SGI PSNR | GI NMI | GI PSNR |", "|---|---|---|---|---|---|---|---|---|"]
        fmt = lambda v: "—" if v is None else f"{v:.4f}"
        for name in dict.fromkeys(r["defense"] for r in rows):
            m = lambda att, key: _b_mean(rows, name, att, key, last)
            lines.append(f"| {name} | {fmt(m('sgi', 'accuracy'))} | "
                         f"{fmt(m('sgi', 'accuracy_last5'))} | "
                         f"{fmt(m('sgi', 'client_model_accuracy'))} | "
                         f"{fmt(m('sgi', 'client_model_local_accuracy'))} | "
                         f"{fmt(m('sgi', 'nmi'))} | {m('sgi', 'psnr'):.2f} | "
                         f"{fmt(m('gi', 'nmi'))} | {m('gi', 'psnr'):.2f} |")
        lines += same_scores_lines(rows, last)
        lines += ["", f"Checks at seed {o['seed']} (same rules as above):", ""]
        lines += [f"- **{'PASS' if c['pass'] else 'FAIL'}** {c['check']}: {c['detail']}"
                  for c in o["checks"]]
    return lines


# Options added after a run was made are absent from its settings: their value then.
_SETTING_DEFAULTS = {"a_trained_rounds": 0, "upload": "weights", "a_protocol": "pruned_model",
                     "dataset": DEFAULT_DATASET, "partition": "dirichlet", "pseudo_start": "kept",
                     "observer_fill": "sorted_cut", "sgi_mask": "support", "b_model": "conv2",
                     "schemes": list(SCHEMES)}


def settings_diff(other: dict, main: dict, skip_extra=()) -> list[tuple[str, object, object]]:
    """(setting, other's value, main's value) for each setting that differs (seed, the
    file-naming options and ``skip_extra`` aside; absent options read as their value
    before they existed)."""
    # The split of the attack calls moves numbers at float rounding only, as another
    # machine would: runs that differ in it are reruns of one setting.
    skip = {"seed", "parts", "combine", "out", "tag", "victims_per_call", *skip_extra}
    get = lambda s, k: s.get(k, _SETTING_DEFAULTS.get(k))
    return [(k, get(other, k), get(main, k)) for k in sorted(set(other) | set(main))
            if k not in skip and get(other, k) != get(main, k)]


def _same_b_settings(other: dict, main: dict, skip_extra=()) -> str:
    """'yes', or the settings that differ from the seed-0 part B (seed and ``skip_extra``
    aside)."""
    diff = settings_diff(other, main, skip_extra)
    return "yes" if not diff else "differ in " + ", ".join(k for k, _, _ in diff)


def _is_part_run(o) -> bool:
    return (isinstance(o, dict) and isinstance(o.get("settings"), dict)
            and isinstance(o.get("rows"), list) and "seconds" in o)


def _is_partial(o) -> bool:
    """A part-A run of some schemes only (``--schemes``)."""
    return o["settings"].get("schemes", list(SCHEMES)) != list(SCHEMES)


def part_a_variants(out: Path, stem: str = "chu2023") -> tuple[list[tuple[Path, dict]],
                                                                 list[str]]:
    """The part-A variants ``--combine`` reports beside the main part A, and the part-A
    runs of some schemes only it leaves out.

    Variants: the whole-axis runs ``<stem>_A_trained*.json`` and ``<stem>_A_alg1*.json``
    in ``out``, as (path, result) pairs. Left out of them, with a line on stderr: a run
    of some schemes only (``--schemes``: pooled with the others it would cut every
    pooled table to its schemes) and a file that is not a part run (no ``settings``,
    ``rows`` or ``seconds``, such as a report whose name matches). The second list
    names every ``<stem>_A_*.json`` run of some schemes only (a refresh, read with
    ``benchmarks/chu2023_refresh.py``)."""
    variants = []
    for f in sorted(out.glob(f"{stem}_A_trained*.json")) + sorted(out.glob(f"{stem}_A_alg1*.json")):
        o = json.loads(f.read_text())
        if not _is_part_run(o):
            print(f"--combine: {f.name} left out: not a part run (no settings, rows or "
                  "seconds)", file=sys.stderr)
        elif _is_partial(o):
            print(f"--combine: {f.name} left out: a run of {', '.join(o['settings']['schemes'])} "
                  "only (--schemes), not a whole p axis", file=sys.stderr)
        else:
            variants.append((f, o))
    partial = []
    for f in sorted(out.glob(f"{stem}_A_*.json")):
        o = json.loads(f.read_text())
        if _is_part_run(o) and _is_partial(o):
            partial.append(f.name)
    return variants, partial


def combine_mismatches(parts: dict, stem: str = "chu2023") -> list[str]:
    """What keeps part files from being merged by ``--combine``: per part (``parts``:
    name → its results file; part B is the reference), the top-level seed, mode, image
    size, dataset or partition, and every recorded setting (:func:`settings_diff`; the
    defense list aside, which parts A, C and D do not use) that differs from part B's.
    Commits may differ: each part's is recorded in the combined ``commit``."""
    ref = parts["B"]
    out = []
    for name, o in parts.items():
        if name == "B":
            continue
        diff = [(k, o.get(k), ref.get(k)) for k in ("seed", "mode", "image_size", "dataset",
                                                     "partition")
                if k in o and k in ref and o[k] != ref[k]]
        diff += settings_diff(o.get("settings", {}), ref.get("settings", {}),
                              skip_extra=("defenses",))
        if diff:
            out.append(f"{stem}_{name}.json differs from {stem}_B.json in "
                       + ", ".join(f"{k} ({v!r} vs {w!r})" for k, v, w in diff))
    return out


#: Fields every row carries beside the issue's (dataset, model, base, defense, p, attack,
#: nmi, psnr, accuracy), so that rows of another attacked round, λ_pri or p̂ are told
#: apart (part A's B axis and part B's two attacked clients differ further in ``B`` and
#: ``client_id``): ``round`` (the
#: attacked round; part A: the FedAvg rounds the model was trained before the attack, 0
#: at the initial model), ``lambda_pri`` (PriPrune's λ_pri, None for other defenses),
#: ``defense_rate`` (p̂ of Largest / Random / Mix, None without defense pruning),
#: ``accuracy_round`` (the round whose global accuracy ``accuracy`` is: the run's last,
#: for every attacked round) and ``accuracy_at_round`` (the global model's test accuracy
#: after the attacked round, from ``accuracy_by_round``). Part A's ``accuracy`` is None.
ROW_FIELDS = ("round", "lambda_pri", "defense_rate", "accuracy_round", "accuracy_at_round")


def complete_row_fields(rows, settings) -> None:
    """Add the :data:`ROW_FIELDS` a run's rows lack (files recorded before they existed),
    from what the rows and the run's ``settings`` record; values present stay."""
    for r in rows:
        if "round" not in r and r["part"] == "A":
            r["round"] = r.get("trained_rounds", 0)
        if "lambda_pri" not in r:
            r["lambda_pri"] = (settings.get("lambda_pri") if r["defense"] == "priprune"
                               and r["part"] == "B" else None)
        r.setdefault("defense_rate", None)
        by_round = r.get("accuracy_by_round")
        if "accuracy_round" not in r:
            r["accuracy_round"] = (len(by_round) - 1 if by_round and r.get("accuracy")
                                   is not None else None)
        if "accuracy_at_round" not in r:
            r["accuracy_at_round"] = (by_round[r["round"]] if by_round
                                      and 0 <= r["round"] < len(by_round) else None)


def add_round_bounds(result, bd):
    """Thm 1 / Cor 1 per round: each part-B row gets the bound after T = round + 1
    rounds at its upload's zero fraction (the effective p) and B; plus the
    per-round series of the base setting (PruneFL p = 0.3, B of part B)."""
    b_rows = [r for r in result["rows"] if r["part"] == "B"]
    for r in b_rows:
        r["info_bound_bits"] = bd["bound"](r["upload_zero_fraction"], r["B"], r["round"] + 1)
    if b_rows:
        B, R = b_rows[0]["B"], max(r["round"] for r in b_rows) + 1
        bd["per_round"] = [{"T": T, "p": 0.3, "B": B, "bound_bits": bd["bound"](0.3, B, T)}
                           for T in range(1, R + 1)]
    del bd["bound"]


def finalize(result, ds, out: Path = RESULTS):
    """Bounds, acceptance checks, JSON / markdown / PNG of a complete result, in ``out``."""
    bd = bound_table(ds, result["seed"])
    add_round_bounds(result, bd)
    result["bound"] = bd
    result["checks"] = acceptance_checks(result["rows"])
    result["part_a_analyses"] = part_a_analyses(result)
    out.mkdir(parents=True, exist_ok=True)
    stem = result.get("stem", "chu2023")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=float))
    md = markdown(result)
    (out / f"{stem}.md").write_text(md + ("\n" + result["note"] + "\n" if result.get("note") else ""))
    plot(result, out / f"{stem}.png")
    print(md)


def _b_mean(rows, defense, attack, key, last_round, part="B", rate=None):
    sel = [r[key] for r in rows if r["part"] == part and r["defense"] == defense
           and (rate is None or r.get("defense_rate") == rate)
           and r["attack"] == attack and r["round"] == last_round and r.get(key) is not None]
    return float(np.mean(sel)) if sel else None


def rows_p_axis_batch(a: list[dict]) -> int | None:
    """The batch size of part A's Conv-2 p axis, from part-A rows ``a`` alone: the batch
    Random pruning ran at (it is on the p axis only), or in a run without Random
    (``--schemes``) the Conv-2 batch size with the most (scheme, p) settings (the other
    batch sizes carry PruneFL p = 0.3 only); None without Conv-2 rows."""
    bp = next((r["B"] for r in a if r["base"] == "random"), None)
    if bp is not None:
        return bp
    settings = {}
    for r in a:
        if r["model"] == "conv2":
            settings.setdefault(r["B"], set()).add((r["base"], r["p"]))
    return max(settings, key=lambda b: len(settings[b])) if settings else None


def acceptance_checks(rows):
    """The issue's acceptance checks, each PASS/FAIL computed from the rows."""
    checks = []
    a = [r for r in rows if r["part"] == "A"]
    keys = sorted({(r["model"], r["B"], r["base"], r["p"]) for r in a})
    get = lambda k, att: next(r for r in a if (r["model"], r["B"], r["base"], r["p"]) == k
                              and r["attack"] == att)
    if keys:
        # The p axis (Fig 2(a), Fig 7): every scheme at every p, Conv-2, one batch
        # size (Random pruning appears on no other axis).
        bp = rows_p_axis_batch(a)
        p_keys = [k for k in keys if k[:2] == ("conv2", bp)]
        ok = [k for k in p_keys if get(k, "sgi")["psnr"] >= get(k, "gi")["psnr"]]
        bad = [f"{k[2]}/p={k[3]}" for k in p_keys if k not in ok]
        checks.append({"check": f"SGI >= GI in PSNR (mean over victims) at every p tested "
                       f"(Conv-2, B={bp}, every scheme)",
                       "pass": not bad, "detail": f"{len(ok)}/{len(p_keys)} hold"
                       + (f"; fails: {', '.join(bad)}" if bad else "")})
        other = [k for k in keys if k not in p_keys]
        if other:
            ok_o = [k for k in other if get(k, "sgi")["psnr"] >= get(k, "gi")["psnr"]]
            checks.append({"check": "(information, not an acceptance check) SGI >= GI on the "
                           "B and model-size axes", "pass": len(ok_o) == len(other),
                           "detail": ", ".join(f"{k[0]}/B={k[1]}/{k[2]}/p={k[3]}: SGI "
                                               f"{get(k, 'sgi')['psnr']:.1f} vs GI "
                                               f"{get(k, 'gi')['psnr']:.1f} dB" for k in other)})
        for att in ("sgi", "gi"):
            for metric in ("nmi", "psnr"):
                falls, total, series = [], 0, []
                for scheme in sorted({k[2] for k in p_keys}):
                    ps = sorted(k[3] for k in p_keys if k[2] == scheme)
                    if len(ps) < 2:
                        continue
                    total += 1
                    v = [get(("conv2", bp, scheme, p), att)[metric] for p in ps]
                    series.append(f"{scheme} " + "/".join(f"{x:.3g}" for x in v))
                    if all(x >= y for x, y in zip(v, v[1:])):
                        falls.append(scheme)
                checks.append({"check": f"{att.upper()} {metric.upper()} falls monotonically as p "
                               f"grows (Conv-2, B={bp}), per scheme",
                               "pass": total > 0 and len(falls) == total,
                               "detail": f"{len(falls)}/{total} schemes: {', '.join(falls) or '-'}"
                               f" ({'; '.join(series)})"})
    b = [r for r in rows if r["part"] == "B"]
    if b:
        last = max(r["round"] for r in b)
        m = lambda d, att, key: _b_mean(rows, d, att, key, last)
        acc = lambda d, key="accuracy": m(d, "sgi", key)
        # Three readings of "accuracy" (a Pseudo-Pruning client trains and serves
        # its composed model, not the global one): the global model on the test
        # set; the client models on the test set; the client models on their own
        # label mix (FEMNIST's per-writer test data, where the paper evaluates).
        # Without Pseudo-Pruning a client's model is the global model.
        # A fourth: the global model's accuracy averaged over the last LAST_ROUNDS rounds
        # (rows from runs before it was recorded lack it; the check is then not made).
        readings = (("global model, whole test set", "accuracy"),
                    ("client models, whole test set", "client_model_accuracy"),
                    ("client models, own label mix", "client_model_local_accuracy"),
                    (LAST_READING, "accuracy_last5"))
        if acc("priprune") is not None:
            n0, n1 = m("none", "sgi", "nmi"), m("priprune", "sgi", "nmi")
            p0, p1 = m("none", "sgi", "psnr"), m("priprune", "sgi", "psnr")
            gain = (n0 - n1) / n0
            # "Clearly better": NMI at least 5 % lower or PSNR at least 1 dB lower
            # (our threshold; the paper reports a 36.3 % NMI gain on FEMNIST).
            priv = gain >= 0.05 or p0 - p1 >= 1.0
            for label, key in readings:
                if acc("none", key) is None or acc("priprune", key) is None:
                    continue
                # One-sided: the paper's claim is "without accuracy loss"; an accuracy
                # above PruneFL's is no loss.
                acc_ok = acc("priprune", key) >= acc("none", key) - 0.01
                checks.append({"check": "PriPrune on PruneFL: SGI privacy clearly better (NMI -5 % "
                               "or PSNR -1 dB) with accuracy at most 1 point below PruneFL's "
                               f"({label})",
                               "pass": bool(priv and acc_ok),
                               "detail": f"SGI NMI {n0:.4f} -> {n1:.4f} ({gain:+.1%} gain), PSNR "
                               f"{p0:.2f} -> {p1:.2f} dB; accuracy {acc('none', key):.4f} -> "
                               f"{acc('priprune', key):.4f}"})
        parts = [("B", None)] + [("D", r) for r in sorted({r["defense_rate"] for r in rows
                                                           if r["part"] == "D"})]
        for part, rate in parts:
            f = (lambda n, key: _b_mean(rows, n, "sgi", key, last, part=part, rate=rate))
            if f("largest", "accuracy") is None or f("largest_pseudo", "accuracy") is None:
                continue
            where = "" if part == "B" else f" at defense rate {rate:g} (part D)"
            for label, key in readings:
                base, lo, ps = acc("none", key), f("largest", key), f("largest_pseudo", key)
                if None in (base, lo, ps):
                    continue
                loss = base - lo
                rec = (ps - lo) / loss if loss > 0 else float("nan")
                ok = bool(loss > 0 and rec >= 0.5)
                detail = (f"none {base:.4f}, largest {lo:.4f}, largest_pseudo {ps:.4f} "
                          f"(recovered {rec:.0%})")
                if key == "client_model_local_accuracy":
                    # Σ_k h_k·a_k of a model at chance reaches max_k h_k: judged against
                    # the majority-label baseline (OWN_MIX_MARGIN).
                    maj = f("largest_pseudo", "majority_label_local_accuracy")
                    if maj is None:
                        ok, detail = False, (
                            "not evaluable: the majority-label baseline (mean over the "
                            "clients of max_k h_k) is not recorded in these rows; " + detail)
                    elif ps < maj + OWN_MIX_MARGIN:
                        ok, detail = False, (
                            f"not evaluable: at the majority-label baseline (largest_pseudo "
                            f"{ps:.4f} does not beat {maj:.4f}, what always predicting each "
                            f"client's most common label scores, by "
                            f"{100 * OWN_MIX_MARGIN:g} point); " + detail)
                    else:
                        detail += (f"; majority-label baseline {maj:.4f}, beaten by "
                                   f"{100 * (ps - maj):.1f} points")
                checks.append({"check": f"Largest (Pseudo) recovers most (>= 50 %) of Largest's "
                               f"accuracy loss{where} ({label})",
                               "pass": ok, "detail": detail})
    return checks


def a_table_lines(a, settings, title="A. GI vs SGI on pruned FedSGD uploads") -> list[str]:
    """Markdown of part-A rows: one line per (model, B, scheme, p), GI beside SGI."""
    trained = max((r.get("trained_rounds", 0) for r in a), default=0)
    alg1 = any(r.get("protocol") == "alg1" for r in a)
    where = (f"Conv-2 trained {trained} FedAvg rounds with the scheme's mask" if trained
             else "initial dense model, pruned after the local step: Alg 1 weight uploads"
             if alg1 else "initial model")
    # Diagnostics of rows made since they were added (older JSONs lack them).
    diag = all(r.get("pruned_grad_share_victims") for r in a) and bool(a)
    lines = ["", f"## {title} ({where}, lr 0.25)", "",
             f"Attack budget (identical for GI and SGI, paired keys and victims): "
             f"{settings.get('attack')}; {settings.get('victims')} victims per setting (the same "
             "images in every setting of a (model, B) group); mean over victims.", ""]
    if diag:
        lines += ["Pruned share of g: ‖g ⊙ (1 − m)‖² / ‖g‖², the victims' gradient on the "
                  "pruned coordinates" + (" (GI's targets there are −w, whose size against the "
                                           "shared update ‖lr·g ⊙ m‖ is the next column)"
                                           if alg1 else " (GI's targets there are 0)")
                  + "; mean over victims.", ""]
    lines += ["| model | B | base | p | GI NMI | SGI NMI | GI PSNR | SGI PSNR |"
              + (" trained acc |" if trained else "")
              + (" pruned share of g |" if diag else "") + (" ‖w ⊙ (1−m)‖ / ‖lr·g ⊙ m‖ |"
                                                            if diag and alg1 else ""),
              "|---|---|---|---|---|---|---|---|" + ("---|" if trained else "")
              + ("---|" if diag else "") + ("---|" if diag and alg1 else "")]
    keys = sorted({(r["model"], r["B"], r["base"], r["p"]) for r in a},
                  key=lambda k: (k[0], k[1], k[2], k[3]))
    for k in keys:
        g = next(r for r in a if (r["model"], r["B"], r["base"], r["p"]) == k and r["attack"] == "gi")
        s = next(r for r in a if (r["model"], r["B"], r["base"], r["p"]) == k and r["attack"] == "sgi")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {g['nmi']:.4f} | {s['nmi']:.4f} | "
                     f"{g['psnr']:.2f} | {s['psnr']:.2f} |"
                     + (f" {g['trained_accuracy']:.4f} |" if trained else "")
                     + (f" {share_text(np.mean(g['pruned_grad_share_victims']))} |"
                        if diag else "")
                     + (f" {np.mean(g['pruned_weight_ratio_victims']):.1f} |"
                        if diag and alg1 else ""))
    return lines


def _mean_ci(d) -> tuple[float, float, float]:
    """Mean of replicates ``d`` and its 95 % t interval (infinite for one replicate)."""
    from scipy import stats
    d = np.asarray(d, float)
    mean = float(d.mean())
    half = (float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
            if len(d) > 1 else float("inf"))
    return mean, mean - half, mean + half


def _paired_summary(d) -> dict:
    """Mean of paired differences SGI − GI ``d``, its 95 % t interval and the verdict on
    its sign."""
    mean, lo, hi = _mean_ci(d)
    verdict = "SGI better" if lo > 0 else "GI better" if hi < 0 else "not resolved"
    return {"diffs": np.asarray(d, float).tolist(), "mean": mean, "ci": (lo, hi),
            "verdict": verdict}


def _p_axis_rows(a) -> list[dict]:
    """Part A's Conv-2 p-axis rows (:func:`rows_p_axis_batch`), or none when a run lacks
    that axis or predates the per-victim scores."""
    bp = rows_p_axis_batch(a)
    if bp is None:
        return []
    sel = [r for r in a if r["model"] == "conv2" and r["B"] == bp]
    return sel if all("psnr_victims" in r and "nmi_victims" in r for r in sel) else []


def sgi_gi_paired(a) -> list[dict]:
    """SGI − GI in PSNR per p-axis setting of part-A rows, paired over victims.

    Both attacks see the same victims with the same attack key (``attack_all``), so
    the per-victim differences are paired. Per (scheme, p): the differences, their
    mean and its 95 % t interval (victims as independent replicates), and a verdict:
    "SGI better" / "GI better" where the interval excludes 0, else "not resolved".
    The acceptance check compares means only; this says which of its failures (and
    passes) the victims resolve at all.
    """
    sel = _p_axis_rows(a)
    out = []
    for scheme, p in sorted({(r["base"], r["p"]) for r in sel}):
        by = {r["attack"]: r for r in sel if (r["base"], r["p"]) == (scheme, p)}
        d = np.asarray(by["sgi"]["psnr_victims"]) - np.asarray(by["gi"]["psnr_victims"])
        out.append({"B": by["gi"]["B"], "base": scheme, "p": p, "gi_psnr": by["gi"]["psnr"],
                    "sgi_psnr": by["sgi"]["psnr"], **_paired_summary(d)})
    return out


def sgi_gi_pooled(runs: list[list[dict]]) -> list[dict]:
    """:func:`sgi_gi_paired` of several seeds of one protocol, the victims pooled.

    The seeds draw other models, masks and victims, so their victims are independent
    replicates of the same setting; each setting's differences are concatenated.
    Pooled victims ignore a seed's own effect (its model and masks); ``seed_ci`` /
    ``seed_verdict`` take the seeds' mean differences as the replicates instead.
    Only settings present in every run are kept.
    """
    keys = set.intersection(*({(x["B"], x["base"], x["p"]) for x in pr} for pr in runs))
    out = []
    for k in sorted(keys):
        xs = [next(x for x in pr if (x["B"], x["base"], x["p"]) == k) for pr in runs]
        out.append({"B": k[0], "base": k[1], "p": k[2],
                    "gi_psnr": float(np.mean([x["gi_psnr"] for x in xs])),
                    "sgi_psnr": float(np.mean([x["sgi_psnr"] for x in xs])),
                    **_paired_summary([v for x in xs for v in x["diffs"]]),
                    **_seed_level([x["mean"] for x in xs],
                                  ("SGI better", "GI better", "not resolved"))})
    return out


def _seed_level(means, verdicts=("rises", "falls", "not resolved")) -> dict:
    """The seeds' means as replicates: their 95 % t interval and its verdict
    (positive, negative, unresolved)."""
    _, lo, hi = _mean_ci(means)
    return {"seed_ci": (lo, hi),
            "seed_verdict": verdicts[0] if lo > 0 else verdicts[1] if hi < 0 else verdicts[2]}


def p_trend(a) -> list[dict]:
    """Per scheme, attack and metric of part A's Conv-2 p axis: the slope over p, per victim.

    Every setting of a (model, B) group attacks the same victim images, so each victim
    traces its own NMI / PSNR curve over p. Its least-squares slope (per unit p: NMI,
    or dB) is one replicate; the mean slope's 95 % t interval over the victims gives a
    verdict: "falls" / "rises" where it excludes 0, else "not resolved". The acceptance
    check asks for a monotone fall of the victim means; this is information beside it.
    """
    sel = _p_axis_rows(a)
    if len({json.dumps(r.get("victim_indices")) for r in sel}) > 1:
        raise ValueError("p_trend: the p-axis rows attack different victims; per-victim "
                         "slopes need the same victims at every p")
    out = []
    for scheme in sorted({r["base"] for r in sel}):
        ps = sorted({r["p"] for r in sel if r["base"] == scheme})
        if len(ps) < 2:
            continue
        for attack in ("sgi", "gi"):
            for metric in ("nmi", "psnr"):
                curves = np.array([next(r for r in sel if (r["base"], r["p"], r["attack"])
                                        == (scheme, p, attack))[f"{metric}_victims"]
                                   for p in ps]).T  # (victims, rates)
                # Least-squares slope Σ(p − p̄)(v − v̄) / Σ(p − p̄)²: exactly 0 for a flat
                # curve (np.polyfit leaves ~1e-17 there, which a zero-spread interval
                # would call a rise).
                dp = np.asarray(ps) - np.mean(ps)
                slopes = [float(dp @ (c - c.mean()) / (dp @ dp)) for c in curves]
                out.append({"base": scheme, "ps": ps, "attack": attack, "metric": metric,
                            **_trend_summary(slopes)})
    return out


def _trend_summary(slopes) -> dict:
    mean, lo, hi = _mean_ci(slopes)
    return {"slopes": list(slopes), "mean": mean, "ci": (lo, hi),
            "verdict": "falls" if hi < 0 else "rises" if lo > 0 else "not resolved"}


def p_trend_pooled(runs: list[list[dict]]) -> list[dict]:
    """:func:`p_trend` of several seeds of one protocol, the victims' slopes pooled
    (entries with the same scheme, rates, attack and metric in every run), and the
    seeds' mean slopes as replicates (``seed_ci`` / ``seed_verdict``)."""
    key = lambda x: (x["base"], tuple(x["ps"]), x["attack"], x["metric"])
    keys = [key(x) for x in runs[0] if all(key(x) in {key(y) for y in r} for r in runs[1:])]
    out = []
    for k in keys:
        xs = [next(x for x in r if key(x) == k) for r in runs]
        out.append({"base": k[0], "ps": list(k[1]), "attack": k[2], "metric": k[3],
                    **_trend_summary([v for x in xs for v in x["slopes"]]),
                    **_seed_level([x["mean"] for x in xs])})
    return out


def per_run_and_pooled(result, analyse, pool) -> list[tuple[str, list[dict]]]:
    """``analyse(rows)`` for the main part A and each part-A variant, then ``pool`` over
    the runs of each (protocol, trained rounds) made at two or more seeds; as (title,
    entries) pairs, runs without entries left out."""
    runs = [(f"{result.get('stem', 'chu2023')}_A.json (main)", result["seed"],
             [r for r in result["rows"] if r["part"] == "A"])]
    runs += [(o["file"], o["settings"].get("seed"), o["rows"]) for o in result.get("other_A", [])]
    runs = [(name, seed, rows, analyse(rows)) for name, seed, rows in runs if rows]
    runs = [r for r in runs if r[3]]
    groups = {}
    for _, seed, rows, entries in runs:
        proto = (rows[0].get("protocol") or "pruned_model", rows[0].get("trained_rounds", 0))
        groups.setdefault(proto, []).append((seed, entries))
    tables = [(name, entries) for name, _, _, entries in runs]
    tables += [(f"pooled over seeds {', '.join(str(s) for s, _ in g)} ({proto}"
                + (f", trained {trained} rounds" if trained else "") + ")",
                pool([entries for _, entries in g]))
               for (proto, trained), g in groups.items() if len(g) >= 2]
    return tables


def part_a_analyses(result) -> dict:
    """The two part-A analyses beside the checks, for the JSON: SGI − GI paired over
    victims and the per-victim slopes over p, per run and pooled (title → entries)."""
    return {"sgi_minus_gi_psnr": dict(per_run_and_pooled(result, sgi_gi_paired, sgi_gi_pooled)),
            "p_trend": dict(per_run_and_pooled(result, p_trend, p_trend_pooled))}


def p_trend_lines(result) -> list[str]:
    """Markdown of :func:`p_trend` per part-A run and :func:`p_trend_pooled` per protocol
    run at two or more seeds."""
    tables = per_run_and_pooled(result, p_trend, p_trend_pooled)
    if not tables:
        return []
    cols = [("sgi", "nmi"), ("sgi", "psnr"), ("gi", "nmi"), ("gi", "psnr")]
    lines = ["", "## NMI / PSNR against p per scheme, slopes over victims", "",
             "Conv-2 p axis of each part-A run. Each victim is attacked at every p, so its "
             "least-squares slope over p (NMI, or dB, per unit p) is one replicate; cells: "
             "mean slope (95 % t interval over the victims; pooled tables: over the victims "
             "of every seed) and 'falls' / 'rises' where the interval excludes 0. "
             "Information beside the acceptance check, which asks for a monotone fall of "
             "the victim means. Pooling treats the victims of different seeds as "
             "exchangeable: it does not separate a seed's own effect (other initial model "
             "and masks), so its interval is optimistic; the pooled tables' heading also "
             "counts the verdicts with the seeds' mean slopes as the replicates (t interval "
             "with seeds − 1 degrees of freedom), each cell's last word.", ""]
    for name, tr in tables:
        count = lambda att, met, v, field="verdict": sum(
            x[field] == v for x in tr if (x["attack"], x["metric"]) == (att, met))
        n = len({x["base"] for x in tr})
        seeds = "seed_verdict" in tr[0]
        lines += [f"### {name}: falls beyond the interval in "
                  + ", ".join(f"{a.upper()} {m.upper()} {count(a, m, 'falls')}/{n}"
                              for a, m in cols)
                  + "; rises in " + ", ".join(f"{a.upper()} {m.upper()} {count(a, m, 'rises')}"
                                             for a, m in cols)
                  + ("; over seeds, falls in " + ", ".join(
                      f"{a.upper()} {m.upper()} {count(a, m, 'falls', 'seed_verdict')}/{n}"
                      for a, m in cols) + ", rises in " + ", ".join(
                      f"{a.upper()} {m.upper()} {count(a, m, 'rises', 'seed_verdict')}"
                      for a, m in cols) if seeds else ""), "",
                  "| base | p | SGI NMI | SGI PSNR | GI NMI | GI PSNR |",
                  "|---|---|---|---|---|---|"]
        for scheme in sorted({x["base"] for x in tr}):
            cell = {(x["attack"], x["metric"]): x for x in tr if x["base"] == scheme}
            fmt = lambda x, d: (f"{x['mean']:+.{d}f} ({x['ci'][0]:+.{d}f} to "
                                f"{x['ci'][1]:+.{d}f}) {x['verdict']}"
                                + (f"; over seeds {x['seed_verdict']}" if seeds else ""))
            ps = cell[cols[0]]["ps"]
            lines.append(f"| {scheme} | {'/'.join(f'{p:g}' for p in ps)} | "
                         + " | ".join(fmt(cell[c], 3 if c[1] == "nmi" else 1) for c in cols)
                         + " |")
        lines.append("")
    return lines


def sgi_gi_paired_lines(result) -> list[str]:
    """Markdown of :func:`sgi_gi_paired` for the main part A and each part-A variant, and
    of :func:`sgi_gi_pooled` for each protocol run at two or more seeds."""
    tables = per_run_and_pooled(result, sgi_gi_paired, sgi_gi_pooled)
    if not tables:
        return []
    lines = ["", "## SGI − GI in PSNR per setting, paired over victims", "",
             "Conv-2 p axis of each part-A run. Both attacks see the same victims with the "
             "same attack key, so the per-victim differences SGI − GI (dB) are paired; mean "
             "and 95 % t interval over the victims (pooled tables: over the victims of every "
             "seed; GI / SGI PSNR there are the seeds' mean). 'GI better' / 'SGI better': "
             "the interval excludes 0; 'not resolved': it does not. The acceptance check "
             "above compares the means only; this table is information, not a check. "
             "Pooling treats the victims of different seeds as exchangeable: it does not "
             "separate a seed's own effect (other initial model and masks), so its interval "
             "is optimistic; the pooled tables' last column takes the seeds' mean "
             "differences as the replicates instead (t interval with seeds − 1 degrees of "
             "freedom).", ""]
    for name, pr in tables:
        worse = [x for x in pr if x["mean"] < 0]
        seeds = "seed_verdict" in pr[0]
        lines += [f"### {name}: SGI below GI on the mean at {len(worse)}/{len(pr)} settings; "
                  f"GI better beyond the interval at "
                  f"{sum(x['verdict'] == 'GI better' for x in pr)}, SGI better at "
                  f"{sum(x['verdict'] == 'SGI better' for x in pr)}"
                  + (f" (over seeds: GI better at "
                     f"{sum(x['seed_verdict'] == 'GI better' for x in pr)}, SGI better at "
                     f"{sum(x['seed_verdict'] == 'SGI better' for x in pr)})" if seeds else ""),
                  "",
                  "| B | base | p | GI PSNR | SGI PSNR | SGI − GI per victim | mean (95 % CI) "
                  "| verdict |" + (" over seeds (95 % CI) |" if seeds else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if seeds else "")]
        for x in pr:
            lines.append(f"| {x['B']} | {x['base']} | {x['p']} | {x['gi_psnr']:.2f} | "
                         f"{x['sgi_psnr']:.2f} | {' / '.join(f'{v:+.2f}' for v in x['diffs'])} | "
                         f"{x['mean']:+.2f} ({x['ci'][0]:+.2f} to {x['ci'][1]:+.2f}) | "
                         f"{x['verdict']} |"
                         + (f" {x['seed_verdict']} ({x['seed_ci'][0]:+.2f} to "
                            f"{x['seed_ci'][1]:+.2f}) |" if seeds else ""))
        lines.append("")
    return lines


def share_text(x: float) -> str:
    """A pruned share with 4 decimals, or in scientific notation below 0.001."""
    return f"{x:.4f}" if x >= 1e-3 else f"{x:.1e}"


def other_a_tables(result) -> list[str]:
    """Markdown for the part-A variants (``chu2023_A_trained<R>.json`` at a trained model,
    ``chu2023_A_alg1.json`` under the paper's Alg 1 uploads), each with its checks."""
    lines = []
    for o in result.get("other_A", []):
        what = ("A under Alg 1 weight uploads" if o["settings"].get("a_protocol") == "alg1"
                else "A at a trained model")
        lines += a_table_lines(o["rows"], o["settings"],
                               title=f"{what} ({o['file']}, commit {o.get('commit')}, "
                                     f"{o['seconds']:.0f} s)")
        lines += ["", "Checks on these rows (same rules as the acceptance checks above):", ""]
        lines += [f"- **{'PASS' if c['pass'] else 'FAIL'}** {c['check']}: {c['detail']}"
                  for c in o["checks"]]
    if result.get("partial_A"):
        lines += ["", "Part-A runs of some schemes only (`--schemes`: a scheme's rows rerun, "
                  "e.g. after a fix to it), left out of the tables and pools above: "
                  + ", ".join(f"`{n}`" for n in result["partial_A"]) + ". "
                  "`python -m benchmarks.chu2023_refresh` reports each beside the run it "
                  "refreshes, old rows against new (`docs/pruning.md`)."]
    return lines


def dataset_text(result) -> str:
    """What the run trained and attacked on, for the markdown's header."""
    name = result.get("dataset", DEFAULT_DATASET)
    partition = result.get("partition", "dirichlet")
    size = f"{result['image_size']}×{result['image_size']}"
    if name == DEFAULT_DATASET and partition == "dirichlet":
        return f"dataset Fashion-MNIST {size} (FEMNIST/CIFAR-10 unavailable offline)"
    split = ("Dirichlet(0.5) label partitions" if partition == "dirichlet"
             else "one client per natural writer/identity id")
    return f"dataset {name} resized to {size}, {split}"


def command_options(result) -> str:
    """The options that name the run's mode, dataset and partition and, where the result
    records its settings (part B's for a combined result), the options that reproduce
    them: --pseudo-start, --observer-fill and --sgi-mask always (their defaults have
    changed, and settings recorded before an option existed mean its old value: the
    ``*_of`` helpers), the others where they are not the mode's default."""
    mode = result["mode"]
    opts = "" if mode == "full" else f" --{mode}"
    if result.get("dataset", DEFAULT_DATASET) != DEFAULT_DATASET:
        opts += f" --dataset {result['dataset']}"
    if result.get("partition", "dirichlet") != "dirichlet":
        opts += f" --partition {result['partition']}"
    s = result.get("settings_B") or result.get("settings")
    if not s:
        return opts
    ns = argparse.Namespace(**s)
    q = mode in ("quick", "smoke")
    if s.get("seed", 0) != 0:
        opts += f" --seed {s['seed']}"
    if mode != "smoke":  # --smoke fixes its own rounds
        if s.get("image_size") not in (None, 16 if q else 28):
            opts += f" --image-size {s['image_size']}"
        if s.get("rounds") not in (None, 30 if q else 300):
            opts += f" --rounds {s['rounds']}"
    if s.get("upload", "weights") != "weights":
        opts += f" --upload {s['upload']}"
    opts += (f" --pseudo-start {pseudo_start_of(ns)} --observer-fill {observer_fill_of(ns)}"
             f" --sgi-mask {sgi_mask_of(ns)}")
    if b_model(ns) != "conv2":
        opts += f" --b-model {b_model(ns)}"
    if s.get("lambda_pri", 10.0) != 10.0:
        opts += f" --lambda-pri {s['lambda_pri']:g}"
    if s.get("victims_per_call") is not None:
        opts += f" --victims-per-call {s['victims_per_call']}"
    default_defenses = (["none", "largest", "largest_pseudo", "priprune"] if q else
                        ["none", "largest", "random", "mix", "largest_pseudo", "random_pseudo",
                         "mix_pseudo", "priprune"])
    if s.get("defenses") not in (None, default_defenses):
        opts += f" --defenses {','.join(s['defenses'])}"
    return opts


def produced_by(result) -> str:
    """The command line(s) that made ``result``: one process, or (a combined result) one
    ``--parts`` run per part with the recorded options, then ``--combine``."""
    opts = command_options(result)
    if "settings_B" not in result:
        return f"`benchmarks/reproduce_chu2023.py{opts}`"
    parts = ", ".join(p for p in "ABCD" if any(r["part"] == p for r in result["rows"]))
    where = command_options({"mode": "full", "dataset": result.get("dataset", DEFAULT_DATASET),
                             "partition": result.get("partition", "dirichlet")})
    return (f"`benchmarks/reproduce_chu2023.py{opts} --parts P` for P = {parts} (settings "
            f"checked equal by --combine), then `benchmarks/reproduce_chu2023.py --combine"
            f"{where}`")


def split_text(rows) -> str:
    """How many victims each part's attack calls took (the rows'
    ``attack_victims_per_call``; '' for runs recorded before it was), and how to
    repeat them (:func:`with_split`)."""
    sizes = {}
    for r in rows:
        k = r.get("attack_victims_per_call")
        if k is not None:
            sizes.setdefault(r["part"], set()).add(int(k))
    if not sizes:
        return ""
    each = "; ".join(f"part {p}: {', '.join(map(str, sorted(ks)))}"
                     for p, ks in sorted(sizes.items()))
    return (f"Victims per attack call ({each}): each call's size followed the free memory "
            f"unless `--victims-per-call` fixed it, and another size moves the numbers at "
            f"float rounding; `--victims-per-call K` repeats them where every call had K "
            f"victims or all of its group's.")


def markdown(result) -> str:
    rows = result["rows"]
    lines = [f"# Chu et al. 2023 (PriPrune) reproduction — {result['mode']} mode",
             "", f"Device: {result['device']}; seed {result['seed']}; {dataset_text(result)}; "
             f"wall time {result['seconds']:.0f} s; commit(s) {result.get('commit', '?')}. "
             f"Produced by {produced_by(result)}.", ""]
    split = split_text(rows)
    if split:
        lines += [split, ""]
    checks = result.get("checks") or acceptance_checks(rows)
    lines += ["## Acceptance checks (computed from the rows below)", ""]
    lines += [f"- **{'PASS' if c['pass'] else 'FAIL'}** {c['check']}: {c['detail']}" for c in checks]
    sa, sb = result.get("settings", {}), result.get("settings_B", result.get("settings", {}))
    lines += a_table_lines([r for r in rows if r["part"] == "A"], sa)
    b = [r for r in rows if r["part"] == "B"]
    if b:
        last = max(r["round"] for r in b)
        lines += ["", f"## B. PruneFL (p = 0.3) + defenses: accuracy and leakage after {last + 1} "
                  "rounds", "",
                  f"Attack {sb.get('attack_b')}, paired keys; the two observed clients' uploads "
                  f"in the last round, mean. Uploads: {sb.get('upload', 'update')} "
                  "(weights: the server averages the clients' masked weights, withheld ones as "
                  "0, Alg 1 line 11). Client-model acc: mean accuracy of the models the clients "
                  "train from (Pseudo-Pruning / PriPrune keep withheld weights locally; without "
                  "it the global model), on the whole test set and on each client's own label "
                  "mix (FEMNIST-style local test data), over the same clients for every "
                  "defense. " + majority_text(b, last), "",
                  f"| defense | global acc | global acc, last {LAST_ROUNDS} rounds | client-model acc | "
                  f"{own_mix_header(b, last)} | "
                  "SGI NMI | SGI PSNR | GI NMI | GI PSNR | upload zeros | bound (bits) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        fmt = lambda v: "—" if v is None else f"{v:.4f}"
        for name in dict.fromkeys(r["defense"] for r in b):
            m = lambda att, key: _b_mean(rows, name, att, key, last)
            ca = m("sgi", "client_model_accuracy")
            lines.append(f"| {name} | {m('sgi', 'accuracy'):.4f} | "
                         f"{fmt(m('sgi', 'accuracy_last5'))} | "
                         f"{fmt(ca)} | {fmt(m('sgi', 'client_model_local_accuracy'))} | "
                         f"{m('sgi', 'nmi'):.4f} | "
                         f"{m('sgi', 'psnr'):.2f} | {m('gi', 'nmi'):.4f} | {m('gi', 'psnr'):.2f} | "
                         f"{m('sgi', 'upload_zero_fraction'):.3f} | "
                         f"{m('sgi', 'info_bound_bits') or float('nan'):.1f} |")
        lines += same_scores_lines(b, last)
        rounds = sorted({r["round"] for r in b if r["client_id"] == 0})
        lines += ["", "### Leakage vs rounds T (client 0; Fig 2(d), Fig 5(c))", "",
                  "| defense | round | SGI NMI | SGI PSNR | GI NMI | GI PSNR |",
                  "|---|---|---|---|---|---|"]
        for name in ("none", "priprune"):
            for t in rounds:
                sel = {r["attack"]: r for r in b if r["defense"] == name and r["round"] == t
                       and r["client_id"] == 0}
                if "sgi" in sel:
                    lines.append(f"| {name} | {t} | {sel['sgi']['nmi']:.4f} | "
                                 f"{sel['sgi']['psnr']:.2f} | {sel['gi']['nmi']:.4f} | "
                                 f"{sel['gi']['psnr']:.2f} |")
        pp = [r for r in b if r["defense"] == "priprune" and r["attack"] == "sgi"]
        if pp and pp[-1]["priprune_defense_rate_client0"]:
            rates = pp[-1]["priprune_defense_rate_client0"]
            lines += ["", f"PriPrune defense rate p̂ (fraction of d withheld) of client 0 over "
                      f"rounds: {', '.join(f'{x:.3f}' for x in rates)}; mean over the "
                      f"evaluated clients at the end {pp[-1]['priprune_defense_rate_mean']:.3f}. "
                      f"Hyper-parameters: λ_acc {sb.get('lambda_acc')}, λ_pri "
                      f"{sb.get('lambda_pri')}, λ_sha {sb.get('lambda_sha')} × N_PAPER/N, τ "
                      f"{sb.get('tau')}, α_init {sb.get('alpha_init')}, alpha_lr "
                      f"{sb.get('alpha_lr')}."]
    c = [r for r in rows if r["part"] == "C"]
    if c and b:
        last = max(r["round"] for r in b)
        lines += ["", "## C. PriPrune vs λ_pri (paper grid; λ_pri = 10 is part B's run)", "",
                  f"| λ_pri | global acc | client-model acc | {own_mix_header(c, last, 'C')} | "
                  "SGI NMI | SGI PSNR | mean p̂ |",
                  "|---|---|---|---|---|---|---|"]
        variants = [(float(sb.get("lambda_pri", 10.0)), [r for r in b if r["defense"] == "priprune"])]
        variants += [(lp, [r for r in c if r["lambda_pri"] == lp])
                     for lp in sorted({r["lambda_pri"] for r in c})]
        for lp, rs in sorted(variants):
            sel = [r for r in rs if r["attack"] == "sgi" and r["round"] == last]
            if not sel:
                continue
            mean = lambda k: float(np.mean([r[k] for r in sel]))
            loc = [r.get("client_model_local_accuracy") for r in sel]
            loc = "—" if None in loc else f"{float(np.mean(loc)):.4f}"
            lines.append(f"| {lp:g} | {mean('accuracy'):.4f} | {mean('client_model_accuracy'):.4f} | "
                         f"{loc} | "
                         f"{mean('nmi'):.4f} | {mean('psnr'):.2f} | "
                         f"{sel[0]['priprune_defense_rate_mean']:.3f} |")
    d = [r for r in rows if r["part"] == "D"]
    if d and b:
        lines += ["", "## D. Largest / Largest (Pseudo) vs defense rate p̂ (Fig 4(d); p̂ = "
                  f"{sb.get('defense_rate')} is part B's run, 'none' is part B's)", "",
                  f"| p̂ | defense | global acc | client-model acc | {own_mix_header(d, last, 'D')} "
                  "| SGI NMI | SGI PSNR | GI NMI |",
                  "|---|---|---|---|---|---|---|---|"]
        for rate in sorted({r["defense_rate"] for r in d}):
            for name in ("largest", "largest_pseudo"):
                m = lambda att, key: _b_mean(rows, name, att, key, last, part="D", rate=rate)
                if m("sgi", "accuracy") is None:
                    continue
                ca = m("sgi", "client_model_accuracy")
                cl = m("sgi", "client_model_local_accuracy")
                lines.append(f"| {rate:g} | {name} | {m('sgi', 'accuracy'):.4f} | "
                             f"{'—' if ca is None else f'{ca:.4f}'} | "
                             f"{'—' if cl is None else f'{cl:.4f}'} | {m('sgi', 'nmi'):.4f} | "
                             f"{m('sgi', 'psnr'):.2f} | {m('gi', 'nmi'):.4f} |")
    lines += other_a_tables(result)
    lines += sgi_gi_paired_lines(result)
    lines += p_trend_lines(result)
    lines += semantics_summary(result)
    lines += seed_pooled_lines(result)
    lines += other_seed_tables(result)
    lines += fig4_lines(result)
    if result.get("bound"):
        bd = result["bound"]
        lines += ["", f"## Info bound (Thm 1 / Cor 1), bits; d* = {bd['d_star']}, "
                  f"ln det Σ = {bd['logdet_sigma']:.2f}", "",
                  "| p | B=1,T=1 | B=20,T=1 | B=20,T=20 |", "|---|---|---|---|"]
        for p in sorted({r["p"] for r in bd["rows"]}):
            v = {(r["B"], r["T"]): r["bound_bits"] for r in bd["rows"] if r["p"] == p}
            lines.append(f"| {p} | {v[(1, 1)]:.2f} | {v[(20, 1)]:.2f} | {v[(20, 20)]:.2f} |")
        if bd.get("per_round"):
            pr = bd["per_round"]
            lines += ["", f"Per round (p = 0.3, B = {pr[0]['B']}): " + ", ".join(
                f"T={r['T']}: {r['bound_bits']:.0f}" for r in pr) + " bits."]
    lines += ["", "Paper (FEMNIST): " + "; ".join(PAPER["trends"]) +
              f"; PriPrune improves PruneFL's privacy by {PAPER['priprune_vs_prunefl_privacy_gain_femnist']:.1%} "
              "at equal accuracy.", ""]
    return "\n".join(lines)


def p_axis_batch(result) -> int:
    """Part A's p-axis batch size: the recorded ``settings["p_axis_batch"]`` (8 quick, 20
    full), else the batch the rows' Random pruning ran at (it is on the p axis only),
    else 1 (the p axis before the setting existed)."""
    bp = result.get("settings", {}).get("p_axis_batch")
    if bp is None:
        bp = next((r["B"] for r in result["rows"] if r["part"] == "A"
                   and r["base"] == "random"), 1)
    return bp


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bp = p_axis_batch(result)
    a = [r for r in result["rows"] if r["part"] == "A" and r["model"] == "conv2" and r["B"] == bp]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for i, scheme in enumerate(SCHEMES):  # one colour per scheme, in both panels
        for att, ls in (("gi", "--"), ("sgi", "-")):
            pts = sorted((r["p"], r["nmi"]) for r in a if r["base"] == scheme and r["attack"] == att)
            if pts:
                axes[0].plot(*zip(*pts), ls, marker="o", color=f"C{i}",
                             label=f"{scheme} {att.upper()}")
    axes[0].set(xlabel="pruning rate p", ylabel="NMI", title=f"NMI vs p (Conv-2, B={bp})")
    axes[0].legend(fontsize=6)
    for i, scheme in enumerate(SCHEMES):
        pts = sorted((r["p"], r["psnr"]) for r in a if r["base"] == scheme and r["attack"] == "sgi")
        if pts:
            axes[1].plot(*zip(*pts), marker="o", color=f"C{i}", label=scheme)
    axes[1].set(xlabel="pruning rate p", ylabel="PSNR (dB)",
                title=f"SGI PSNR vs p (Conv-2, B={bp})")
    axes[1].legend(fontsize=7)
    rows = result["rows"]
    b = [r for r in rows if r["part"] == "B" and r["attack"] == "sgi"]
    if b:
        last = max(r["round"] for r in b)
        for name in dict.fromkeys(r["defense"] for r in b):
            nm = _b_mean(rows, name, "sgi", "nmi", last)
            acc = _b_mean(rows, name, "sgi", "accuracy", last)
            cacc = _b_mean(rows, name, "sgi", "client_model_accuracy", last)
            axes[2].scatter(acc, nm, marker="o")
            axes[2].annotate(name, (acc, nm), fontsize=7)
            if cacc is not None:
                axes[2].scatter(cacc, nm, marker="x")
                axes[2].annotate(name + " (client)", (cacc, nm), fontsize=7)
    axes[2].set(xlabel="test accuracy (o global, x client model)", ylabel="SGI NMI (last round)",
                title="PruneFL + defenses (Fig 4/5)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _load(ap, dataset, partition, image_size):
    """The dataset, or an argparse error naming the option and the loader's reason."""
    import fedsim.data
    try:
        # seed: the synthetic dataset's own (real data has none); 0, the seed
        # this script has always loaded it with.
        ds = fedsim.data.load_dataset(dataset, image_size=image_size, seed=0)
    except fedsim.data.DatasetError as e:
        ap.error(f"--dataset {dataset}: {e}")
    if partition == "natural" and ds.groups is None:
        ap.error(f"--partition natural: {dataset} carries no writer/identity ids (tfds' emnist "
                 "has none; FEMNIST's writer split needs a source that keeps them, e.g. LEAF)")
    return ds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny budget, for testing the pipeline (implies --quick's settings)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="AB")
    ap.add_argument("--combine", action="store_true",
                    help="merge chu2023_A.json and chu2023_B.json (two processes of one commit) with "
                         "C and D where present; chu2023_B_seed<N>.json (--parts B --seed N) "
                         "are reported as replications (runs made with --tag are not)")
    ap.add_argument("--rounds", type=int, default=None, help="override the FL rounds")
    ap.add_argument("--defenses", default=None, help="comma list overriding part B's defenses")
    ap.add_argument("--tag", default=None, metavar="NAME",
                    help="append _NAME to the output file of a --parts run (a side run with "
                         "other --defenses or settings must not replace the part's main file; "
                         "--combine never pools a tagged run as a replication, and reports "
                         "<stem>_B*_fig4.json as the Fig 4 defense comparison)")
    ap.add_argument("--upload", choices=UPLOADS, default="weights",
                    help="what pruned-FL clients upload: their masked weights (the paper, Alg 1 "
                         "line 11: the server averages withheld weights as 0), masked updates "
                         "(a withheld weight keeps its global value), or 'split': real pruning "
                         "uploads weights, Pseudo-Pruning and PriPrune updates (upload_of), or "
                         "'sender': updates, averaged per coordinate over the clients that sent "
                         "it (training.aggregation=sender_mean)")
    ap.add_argument("--pseudo-start", choices=PSEUDO_STARTS, default="masked",
                    help="parts B-D with Pseudo-Pruning or PriPrune: a weight a client withheld "
                         "and PruneFL pruned since is 0 in the client's next start model "
                         "(masked, as the engine does) or keeps its old local value (kept, as "
                         "part B's runs recorded before Nov 27 2026 did; their settings have "
                         "no pseudo_start)")
    ap.add_argument("--observer-fill", choices=OBSERVER_FILLS, default="uniform",
                    help="how an observed round's cohort is completed around the observed "
                         "clients (the engine's observer.fill): uniform, or sorted_cut, as "
                         "runs recorded before Nov 27 2026 did (their settings have no "
                         "observer_fill)")
    ap.add_argument("--sgi-mask", choices=sgi.MASKS, default="model",
                    help="SGI's mask (attacks.sgi): 'model', Alg 2 line 3's 1[w_g + Δ != 0] "
                         "(default), or 'support', the upload's non-zeros, which also drops "
                         "shared weights whose change is 0 (runs recorded before Nov 27 2026; "
                         "their settings have no sgi_mask)")
    ap.add_argument("--a-trained-rounds", type=int, default=0, metavar="R",
                    help="part A: train each pruned Conv-2 by FedAvg for R rounds (part B's "
                         "clients, the scheme's mask fixed) and attack uploads at the trained "
                         "model; writes chu2023_A_trained<R>.json")
    ap.add_argument("--a-protocol", choices=A_PROTOCOLS, default="pruned_model",
                    help="part A's upload: 'pruned_model' (default): FedSGD update of the pruned "
                         "model, zeros where pruned; 'alg1': the paper's Alg 1, the victim trains "
                         "the dense model and prunes it afterwards, uploading masked weights (GI "
                         "sees -w at the pruned coordinates, SGI masks them off); writes "
                         "chu2023_A_alg1.json")
    ap.add_argument("--schemes", default=None, metavar="LIST",
                    help="part A: run the p axis of these base schemes only (comma list of "
                         f"{', '.join(SCHEMES)}; default all; the B and model-size axes run "
                         "only with prunefl): a refresh of one scheme's rows, e.g. after a fix "
                         "to it; --combine leaves such a run out of the part-A variants it "
                         "reports and pools")
    ap.add_argument("--victims-per-call", type=int, default=None, metavar="K",
                    help="attack the victims in calls of K (every part, both attacks). "
                         "Default: as many as the free memory allows, which can differ between "
                         "runs and moves the numbers at float rounding; each row records its "
                         "call size (attack_victims_per_call), and passing it here repeats "
                         "a run's numbers")
    ap.add_argument("--b-model", choices=B_MODELS, default="conv2",
                    help="the model parts B, C and D train (default conv2; vgg11 is the "
                         "paper's CIFAR-10 model, ~7x Conv-2's FLOPs: a side run that writes "
                         "chu2023_B_vgg11*.json, never pooled as a replication)")
    ap.add_argument("--lambda-pri", type=float, default=None,
                    help="override PriPrune's λ_pri in part B (default 10; exploratory runs)")
    ap.add_argument("--out", default=None,
                    help="write the results here instead of benchmarks/results (exploratory runs)")
    ap.add_argument("--dataset", default=DEFAULT_DATASET,
                    help="any dataset fedsim.data.load_dataset knows (default fashion_mnist, "
                         "offline here; emnist / cifar10 through tensorflow-datasets where a "
                         "network or a prepared data_dir exists); another dataset writes "
                         "chu2023_<dataset>_* files")
    ap.add_argument("--partition", choices=PARTITIONS, default="dirichlet",
                    help="clients' data: Dirichlet(0.5) label mixes (default), or 'natural': one "
                         "client per writer/identity id of the dataset (FEMNIST-style; needs a "
                         "source that carries the ids)")
    ap.add_argument("--image-size", type=int, default=None,
                    help="resize images to this size (default 16 with --quick/--smoke, else 28)")
    args = ap.parse_args(argv)
    if args.victims_per_call is not None and args.victims_per_call < 1:
        ap.error(f"--victims-per-call must be a positive integer, got {args.victims_per_call}")
    if args.image_size is not None and args.image_size < 12:
        ap.error(f"--image-size must be >= 12 (part A's LeNet-5 has no feature map left "
                 f"below that), got {args.image_size}")
    if args.schemes is None:
        args.schemes = list(SCHEMES)
    else:
        if args.parts != "A" or args.combine:
            ap.error("--schemes restricts part A's p axis: use it with --parts A")
        wanted = [s.strip() for s in args.schemes.split(",")]
        unknown = [s for s in wanted if s not in SCHEMES]
        if unknown or not wanted:
            ap.error(f"--schemes: unknown scheme(s) {', '.join(map(repr, unknown))}; "
                     f"choose from {', '.join(SCHEMES)}")
        if len(set(wanted)) != len(wanted):
            ap.error(f"--schemes names a scheme twice: {args.schemes!r}")
        args.schemes = [s for s in SCHEMES if s in wanted]  # SCHEMES' order, as a full run
        if args.schemes != list(SCHEMES) and args.tag is None and args.out is None:
            ap.error("--schemes writes part A's rows of some schemes only: name the file with "
                     "--tag or write it elsewhere with --out, so it does not replace the "
                     "part's whole-axis file")
    stem = output_stem(args.dataset, args.partition)
    if args.tag is not None:
        if not re.fullmatch(r"[A-Za-z0-9]+(_[A-Za-z0-9]+)*", args.tag):
            ap.error(f"--tag must be letters, digits and single underscores, got {args.tag!r}")
        if args.combine or ("A" in args.parts and "B" in args.parts):
            ap.error("--tag names the file of a --parts run (not A and B together, not --combine)")
    if args.b_model != "conv2" and (args.combine or not set(args.parts) & set("BCD")):
        ap.error("--b-model is the model of parts B, C and D: use it with --parts B (or C, D)")
    if args.a_trained_rounds < 0:
        ap.error(f"--a-trained-rounds must be >= 0, got {args.a_trained_rounds}")
    if args.a_trained_rounds and ("A" not in args.parts or "B" in args.parts):
        ap.error("--a-trained-rounds is a part-A variant: use it with --parts A")
    if args.a_protocol != "pruned_model":
        if "A" not in args.parts or "B" in args.parts:
            ap.error("--a-protocol is a part-A variant: use it with --parts A")
        if args.a_trained_rounds:
            ap.error("--a-protocol alg1 attacks the initial dense model: drop --a-trained-rounds")
    # Local, not a module global: a second main() in the same process (tests) must
    # not inherit the first one's --out.
    out_dir = Path(args.out) if args.out else RESULTS
    if args.combine:
        missing = [f"{stem}_{part}.json" for part in "AB"
                   if not (out_dir / f"{stem}_{part}.json").exists()]
        if missing:
            opts = command_options({"mode": "full", "dataset": args.dataset,
                                    "partition": args.partition})
            ap.error(f"--combine needs {' and '.join(missing)} in {out_dir}: run "
                     f"`--quick --parts A{opts}` and `--quick --parts B{opts}` first")
        a = json.loads((out_dir / f"{stem}_A.json").read_text())
        b = json.loads((out_dir / f"{stem}_B.json").read_text())
        cp = out_dir / f"{stem}_C.json"
        c = json.loads(cp.read_text()) if cp.exists() else {"rows": [], "seconds": 0.0}
        dp = out_dir / f"{stem}_D.json"
        dd = json.loads(dp.read_text()) if dp.exists() else {"rows": [], "seconds": 0.0}
        # Parts made with other settings would be read against part B's rows (C and D
        # against its `none`, all of them on its last round): refused, not merged.
        bad = combine_mismatches({"A": a, "B": b, **({"C": c} if c["rows"] else {}),
                                  **({"D": dd} if dd["rows"] else {})}, stem)
        if bad:
            ap.error("--combine: the parts were made with other settings; rerun the "
                     "differing part(s) with part B's: " + "; ".join(bad))
        ds = _load(ap, args.dataset, args.partition, a["image_size"])
        complete_row_fields(a["rows"], a["settings"])
        for o in (b, c, dd):
            if o["rows"]:
                add_majority_baseline(o["rows"], b["settings"], ds)
                complete_row_fields(o["rows"], b["settings"])
        result = {**a, "rows": a["rows"] + b["rows"] + c["rows"] + dd["rows"],
                  "seconds": a["seconds"] + b["seconds"] + c["seconds"] + dd["seconds"],
                  "commit": f"A {a.get('commit')}, B {b.get('commit')}"
                            + (f", C {c.get('commit')}" if c["rows"] else "")
                            + (f", D {dd.get('commit')}" if dd["rows"] else ""),
                  "note": "parts A, B (and C, D where present) ran as separate processes "
                          "(--parts A, --parts B, ...) with the same seed, merged by --combine; "
                          "the commits of each part are recorded" + (f" ({a['commit_note']})"
                                                      if a.get("commit_note") else ""),
                  "settings_B": b["settings"]}
        result["other_seeds_B"] = other_b_runs(out_dir, stem, ds)
        result["fig4_B"] = fig4_runs(out_dir, stem, ds)
        variants, result["partial_A"] = part_a_variants(out_dir, stem)
        result["other_A"] = [
            {"file": f.name, "commit": o.get("commit"), "seconds": o["seconds"],
             "settings": o["settings"], "rows": o["rows"], "checks": acceptance_checks(o["rows"])}
            for f, o in variants]
        result.update(stem=stem, dataset=args.dataset, partition=args.partition)
        finalize(result, ds, out_dir)
        return
    q = args.quick or args.smoke
    args.image_size = args.image_size or (16 if q else 28)
    args.rates = [0.1, 0.5, 0.9] if q else [0.1, 0.3, 0.5, 0.7, 0.9]
    args.batch_sizes = [1, 4, 8] if q else [1, 4, 8, 16, 20]
    args.model_sizes = ["lenet5", "conv2", "vgg11"]
    args.synflow_iterations = 20 if q else 100
    # Same budget for GI and SGI (paired keys); best of `restarts` by attack loss.
    args.attack = {"iterations": 200 if q else 1000, "tv": 1e-3, "restarts": 1 if q else 4}
    args.victims = 3 if q else 4
    # Batch of the p axis (and the model-size axis): the paper's Fig 2 is FEMNIST at
    # B = 20, where one upload mixes 20 images. At B = 1 the untrained Conv-2's
    # upload determines the image at every p (SGI PSNR 40-57 dB at p = 0.1-0.5 in the
    # previous run), so the p trend drowned in that saturation.
    args.p_axis_batch = 8 if q else 20
    args.attack_b = {"iterations": 150 if q else 1000, "tv": 1e-3, "restarts": 1 if q else 4}
    # Part B: FedSGD as the paper's FEMNIST runs (batch 20, one local update a round);
    # quick mode has 20 clients, 10 a round, so each takes part ~15 times in 30 rounds
    # (the first version: 50 clients x 8 examples, 20 rounds, ~4 times each, which left
    # Pseudo-Pruning's kept weights stale and PriPrune's α with ~4 steps).
    args.local_batch = 20
    args.clients, args.clients_per_round = (20, 10) if q else (193, 10)
    args.rounds = args.rounds or (30 if q else 300)
    args.reconfigs = 2 if q else 5
    args.lr = 0.1
    # Paper: λ_acc ∈ {1,5,10}, λ_pri ∈ {1,10,15}, λ_sha ∈ {2e-5, 2e-6}; we take
    # (1, 10, 2e-5), λ_sha scaled by N_PAPER/N (see N_PAPER). α: the paper gives
    # each client ~1000 α steps (20,000 rounds, 10 of 193 clients per round);
    # quick mode gives ~15 (one per participation), Adam on logit(α) with its state
    # kept across rounds, so a coordinate pushed the same way every time crosses
    # ½ from α = 0.1 (logit −2.2) after ~5 steps of 0.5.
    args.lambda_acc, args.lambda_sha = 1.0, 2e-5
    args.lambda_pri = 10.0 if args.lambda_pri is None else args.lambda_pri
    args.tau, args.alpha_lr, args.alpha_init = 0.5, 0.5, 0.1
    args.lambda_pri_grid = [1.0, 15.0]  # part C (the paper's other λ_pri values)
    args.defense_rate = 0.3  # p̂ of Largest/Random/Mix (paper: 0.3; Mix 0.15 + 0.15)
    # Part D: the low end of the paper's fixed-rate range 0.1–0.6 (Fig 4(d)).
    args.defense_rate_grid = [0.1]
    full = ["none", "largest", "random", "mix", "largest_pseudo", "random_pseudo", "mix_pseudo",
            "priprune"]
    quick = ["none", "largest", "largest_pseudo", "priprune"]
    args.defenses = args.defenses.split(",") if args.defenses else (quick if q else full)
    if args.smoke:  # the whole pipeline on a tiny budget (tests/defenses); numbers meaningless
        args.rates, args.batch_sizes, args.model_sizes = [0.5, 0.9], [1], ["conv2"]
        args.p_axis_batch, args.victims, args.synflow_iterations = 1, 1, 2
        args.attack = {"iterations": 3, "tv": 1e-3, "restarts": 1}
        args.attack_b = {"iterations": 3, "tv": 1e-3, "restarts": 1}
        args.clients, args.clients_per_round, args.rounds, args.local_batch = 6, 3, 3, 4
        args.lambda_pri_grid, args.defense_rate_grid = [15.0], [0.1]
    ds = _load(ap, args.dataset, args.partition, args.image_size)
    if args.partition == "natural" and len(np.unique(ds.groups)) < args.clients:
        ap.error(f"--partition natural: {args.dataset} has {len(np.unique(ds.groups))} writer/"
                 f"identity ids, fewer than the {args.clients} clients this mode needs")
    commit = git_commit()  # at start: the code this process loaded
    rows, t0 = [], time.perf_counter()
    if "A" in args.parts:
        part_a(args, ds, rows, args.seed)
    if "B" in args.parts:
        part_b(args, ds, rows, args.seed)
    if "C" in args.parts:
        part_c(args, ds, rows, args.seed)
    if "D" in args.parts:
        part_d(args, ds, rows, args.seed)
    result = {"mode": "smoke" if args.smoke else ("quick" if q else "full"), "seed": args.seed,
              "image_size": args.image_size, "dataset": args.dataset,
              "partition": args.partition, "input_shape": list(ds.input_shape),
              "num_classes": ds.num_classes, "stem": stem, "commit": commit,
              "convolution": models.conv_settings(),
              "device": f"{jax.default_backend()} ({platform.processor() or platform.machine()})",
              "seconds": time.perf_counter() - t0, "settings": {
                  k: v for k, v in vars(args).items() if k not in ("quick",)},
              "rows": rows, "paper": PAPER}
    if "A" in args.parts and "B" in args.parts:  # one process ran everything
        finalize(result, ds, out_dir)
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    # A part at another seed (a replication) does not replace the seed-0 part that
    # --combine merges; --combine reports it beside it (see other_seed_tables).
    # Other upload semantics than the default are exploratory: their own file.
    suffix = ("" if args.upload == "weights" else f"_{args.upload}_uploads") \
        + (f"_trained{args.a_trained_rounds}" if args.a_trained_rounds else "") \
        + ("" if args.a_protocol == "pruned_model" else f"_{args.a_protocol}") \
        + ("" if args.b_model == "conv2" else f"_{args.b_model}") \
        + ("" if args.seed == 0 else f"_seed{args.seed}") \
        + (f"_{args.tag}" if args.tag else "")
    (out_dir / f"{stem}_{args.parts}{suffix}.json").write_text(
        json.dumps(result, indent=1, default=float))
    print(markdown(result))

if __name__ == "__main__":
    main()
