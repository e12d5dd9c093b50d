"""Observed uploads on disk, so that an attack run can resume and re-attack.

``fedsim attack`` with ``output.checkpoint_every`` writes every observed round
to ``RUN_DIR/observations/round_RRRRRR.npz`` before the checkpoint after that
round is saved. A rerun resumes the simulation from its newest checkpoint and
reads the rounds it does not simulate again from here; a finished run simulates
nothing and only attacks again (with a changed ``attack`` section, for one).

One file per round holds the round's global parameters once, and per observed
client its upload, its ground-truth data and the observation's scalar fields,
with the config fingerprint (:func:`fedsim.checkpoint.config_fingerprint`) of
the run that wrote it. A file from another config, model or client set is
refused by name. Files are written to a temporary name and renamed, so a run
killed mid-write leaves no partial file behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedsim.observer import ObservedUpload
from fedsim.typing import ApplyFn, Observation, Params

FORMAT = 1
# Observation fields that are plain values (the arrays and apply_fn are stored apart).
_SCALARS = ("algorithm", "lr", "local_steps", "batch_size", "num_examples", "num_classes",
            "client_id", "round")


class ObservationStoreError(RuntimeError):
    """A stored round is missing, unreadable or from another run; names the file."""


def round_path(directory, round_idx: int) -> Path:
    """Where round ``round_idx``'s observations live."""
    return Path(directory) / f"round_{round_idx:06d}.npz"


def save_round(directory, uploads: list[ObservedUpload], fingerprint: str) -> Path:
    """Write one round's observed uploads (all of the same round) atomically.

    Args:
      directory: ``RUN_DIR/observations``; created if missing.
      uploads: the round's observed uploads, as the simulation returned them.
      fingerprint: the config fingerprint of the run.

    Returns:
      The file written.
    """
    rounds = {u.observation.round for u in uploads}
    if len(rounds) != 1:
        raise ValueError(f"save_round takes the uploads of one round, got rounds {sorted(rounds)}")
    (round_idx,) = rounds
    params = jax.tree_util.tree_leaves(uploads[0].observation.params)
    arrays = {f"params/{i:05d}": np.asarray(leaf) for i, leaf in enumerate(params)}
    clients = []
    for u in uploads:
        o, cid = u.observation, u.observation.client_id
        for i, leaf in enumerate(jax.tree_util.tree_leaves(o.update)):
            arrays[f"c{cid}/update/{i:05d}"] = np.asarray(leaf)
        arrays[f"c{cid}/x"], arrays[f"c{cid}/y"] = np.asarray(u.x), np.asarray(u.y)
        clients.append({name: getattr(o, name) for name in _SCALARS}
                       | {"input_shape": list(o.input_shape)})
    meta = {"format": FORMAT, "config_fingerprint": fingerprint, "round": round_idx,
            "num_param_leaves": len(params), "clients": clients}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path = round_path(directory, round_idx)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_round(directory, round_idx: int, fingerprint: str | Sequence[str], params_like: Params,
               apply_fn: ApplyFn, clients: list[int]) -> list[ObservedUpload]:
    """Read back what :func:`save_round` wrote for ``round_idx``.

    Args:
      directory: ``RUN_DIR/observations``.
      round_idx: the observed round.
      fingerprint: the current config's fingerprint, or the fingerprints it
        accepts (:func:`fedsim.checkpoint.accepted_fingerprints`), the current
        one first; the file's must be one of them.
      params_like: a pytree with the model's parameter structure, shapes and
        dtypes (arrays or ``jax.ShapeDtypeStruct``).
      apply_fn: the model's apply function (not stored: it is code).
      clients: the observed clients the current config expects, in order.

    Returns:
      The round's uploads, in the order of ``clients``.

    Raises:
      ObservationStoreError: the file is missing, unreadable, from another
        config, or does not match the model or the clients.
    """
    path = round_path(directory, round_idx)
    if not path.is_file():
        raise ObservationStoreError(f"{path} does not exist")
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
    except Exception as e:
        raise ObservationStoreError(f"{path} is unreadable or corrupted ({type(e).__name__}: "
                                    f"{str(e)[:200]}); delete it to start over") from None
    accepted = (fingerprint,) if isinstance(fingerprint, str) else tuple(fingerprint)
    if meta.get("config_fingerprint") not in accepted:
        raise ObservationStoreError(
            f"{path} was written by a different config (fingerprint "
            f"{meta.get('config_fingerprint')} != {accepted[0]})")
    ref, treedef = jax.tree_util.tree_flatten(params_like)

    def tree(prefix: str, what: str):
        names = sorted(k for k in arrays if k.startswith(prefix + "/"))
        shapes = [arrays[n].shape for n in names]
        if shapes != [tuple(r.shape) for r in ref]:
            raise ObservationStoreError(
                f"{path}: the stored {what} ({len(names)} arrays of shapes {shapes[:3]}...) "
                f"does not match the model's parameters ({len(ref)} arrays of shapes "
                f"{[tuple(r.shape) for r in ref[:3]]}...)")
        return jax.tree_util.tree_unflatten(
            treedef, [jnp.asarray(arrays[n], dtype=r.dtype) for n, r in zip(names, ref)])

    params = tree("params", "global model")
    by_client = {c["client_id"]: c for c in meta["clients"]}
    if sorted(by_client) != sorted(clients):
        raise ObservationStoreError(f"{path} holds clients {sorted(by_client)}, the config "
                                    f"observes {sorted(clients)}")
    uploads = []
    for cid in clients:
        fields = dict(by_client[cid])
        input_shape = tuple(fields.pop("input_shape"))
        y = arrays[f"c{cid}/y"]
        obs = Observation(update=tree(f"c{cid}/update", f"upload of client {cid}"), params=params,
                          apply_fn=apply_fn, labels=jnp.asarray(y), input_shape=input_shape,
                          **fields)
        uploads.append(ObservedUpload(obs, arrays[f"c{cid}/x"], y))
    return uploads
