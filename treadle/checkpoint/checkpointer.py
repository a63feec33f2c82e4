"""The checkpointer: saves what it is handed, ``states={name: Stateful}``, and puts it back.

    ckpt = Checkpointer(strategy)
    ckpt.save(path, {"model": ..., "optim": ..., "loop": ...},
              rank_states={"optim": ...}, meta={"iter": 120}, run="20261123_2301-ab12cd34")
    state, own = ckpt.load(path, states)  # own: this rank's file (its RNG, "rank_state")
    ckpt.restore(states, state)          # every owner's check first, then each load_state_dict
    ckpt.restore(rank_states, own["rank_state"])

A *Stateful* is anything with ``state_dict()`` / ``load_state_dict()`` (torch's
``torch.distributed.checkpoint.stateful.Stateful`` protocol); a plain dict is saved as
it is. ``states`` go to ``state.pt`` (written once, by rank 0); ``rank_states``, what
differs from one process to the next, go with that process's RNG to its own
``rng_rank<r>.pt``. The checkpoint is a treadle checkpoint directory
(treadle/checkpoint/io.py: atomic, verified by a manifest, read with ``weights_only``).

Where and how the bytes are written is the strategy's part (its ``write_checkpoint`` /
``read_checkpoint`` primitives: one file per payload from rank 0, or, for a strategy
that shards, DCP files from every rank holding the tensors of the entries whose owner
is marked ``sharded``; see treadle/checkpoint/tree.py). Before any write, every rank
checks its share for NaN and inf, and the path for another run's checkpoint; all ranks
agree, so they raise alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from treadle.checkpoint.directory import claim_checkpoint_path
from treadle.checkpoint.finite import first_nonfinite, named_tensors
from treadle.checkpoint.io import STATE_FILE, CheckpointError, UnreadableCheckpointError
from treadle.checkpoint.rng import get_rng_state


def rng_file(rank: int) -> str:
    """The file holding rank ``rank``'s RNG and its ``rank_state``."""
    return f"rng_rank{rank}.pt"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class StorageBackend(Protocol):
    """What a checkpointer needs of a strategy (treadle/strategies/base.py)."""

    rank: int
    distributed: bool

    def write_checkpoint(self, path: str | Path, payloads: dict[str, Any], meta: dict[str, Any],
                         writer: Callable[..., Path] | None = None, sharded: Iterable[str] = ()) -> Path: ...

    def read_checkpoint(self, path: str | Path,
                        template: Callable[[set[str] | None], dict[str, Any]] | None = None) -> dict[str, Any]: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


def _state_of(obj: Any) -> Any:
    return obj.state_dict() if callable(getattr(obj, "state_dict", None)) else obj


def _template_of(obj: Any, name: str, saved: set[str] | None) -> Any:
    """What a sharded load reads into for ``obj``: its ``load_template(has)`` where it has
    one and the checkpoint's keys are known (``saved``: DCP's flattened keys), else its state."""
    template = getattr(obj, "load_template", None)
    if saved is None or not callable(template):
        return _state_of(obj)
    return template(lambda key: f"{name}.{key}" in saved)


class Checkpointer:
    """Save, load and restore named states through ``backend`` (a strategy)."""

    def __init__(self, backend: StorageBackend) -> None:
        self.backend = backend

    def save(self, path: str | Path, states: Mapping[str, Any], *, rank_states: Mapping[str, Any] | None = None,
             meta: Mapping[str, Any] | None = None, run: str | None = None,
             writer: Callable[..., Path] | None = None, callback: Callable[[dict[str, Any]], Any] | None = None,
             describe: Callable[[dict[str, Any]], str | None] | None = None, hint: str = "") -> Path:
        """Write ``states`` (and this rank's ``rank_states`` and RNG) to ``path``; every
        rank calls it. ``run``: this run's id, recorded in the manifest; a path holding
        what another run saved is refused. ``callback(state)`` may edit the collected
        state first (the Trainer's ``before_save_checkpoint`` hooks). ``describe(state)``
        names the first non-finite tensor for a person (default: its key path), ``hint``
        ends that error. ``writer``: see the strategy's ``write_checkpoint``. Returns the
        path written (rank 0's; the same path elsewhere)."""
        state = {name: _state_of(obj) for name, obj in states.items()}
        if callback is not None:
            callback(state)
        meta = {**(meta or {}), **({"run": run} if run is not None else {})}
        self.check_savable(path, state, run, meta.get("iter"), describe=describe, hint=hint)
        return self.backend.write_checkpoint(path, self.payloads(state, rank_states), meta, writer=writer,
                                             sharded=sharded_names(states))

    def save_weights(self, path: str | Path, weights: Mapping[str, Any], *, meta: Mapping[str, Any] | None = None,
                     run: str | None = None) -> Path:
        """Write a weights-only checkpoint (``state.pt`` = ``weights``, e.g. ``{"model": full
        state dict}``; no RNG files) at ``path`` from rank 0, after the checks of
        :meth:`save`: a path holding another run's checkpoint, or a non-finite tensor in
        rank 0's ``weights`` (the others' are not read), raises on every rank alike and
        nothing is written. Every rank calls it. Returns ``path``."""
        from treadle.checkpoint.io import save_checkpoint

        mine = weights if self.backend.rank == 0 else {}
        meta = {**(meta or {}), **({"run": run} if run is not None else {})}
        self.check_savable(path, mine, run, meta.get("iter"))
        if self.backend.rank == 0:
            save_checkpoint(path, {STATE_FILE: dict(weights)}, meta=meta)
        return Path(path)

    def payloads(self, states: Mapping[str, Any], rank_states: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The files :meth:`save` hands the strategy: ``state.pt`` and this rank's
        ``rng_rank<r>.pt`` (its RNGs, and ``rank_states`` under ``rank_state``).
        References only: nothing is copied (an async saver may reserve buffers for them)."""
        own = get_rng_state()
        own["rank_state"] = {name: _state_of(obj) for name, obj in (rank_states or {}).items()}
        return {STATE_FILE: {name: _state_of(obj) for name, obj in states.items()}, rng_file(self.backend.rank): own}

    def check_savable(self, path: str | Path, state: Mapping[str, Any], run: str | None, where: Any = None, *,
                      describe: Callable[[dict[str, Any]], str | None] | None = None, hint: str = "") -> None:
        """Raise on every rank alike when any rank's share of ``state`` holds NaN or inf
        (named), or when ``path`` holds something run ``run`` did not save (rank 0 looks)."""
        refusal = None
        if run is not None and self.backend.rank == 0:
            try:
                claim_checkpoint_path(path, run, rename=False)
            except CheckpointError as e:
                refusal = str(e)
        if describe is not None:
            bad = describe(state)
        else:
            name = first_nonfinite(named_tensors(state))
            bad = repr(name) if name is not None else None
        problems = self.backend.all_gather_object((bad, refusal))
        bad = next((b for b, _ in problems if b is not None), None)
        if bad is not None:
            at = f" at iteration {where}" if where is not None else ""
            raise FloatingPointError(f"refusing to save {path}: {bad} holds NaN or inf{at}{hint}; the checkpoints "
                                     "saved before are kept")
        if problems[0][1] is not None:
            raise CheckpointError(problems[0][1])

    def load(self, path: str | Path, states: Mapping[str, Any] | None = None
             ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``(state, this rank's RNG file)`` of the checkpoint at ``path``, verified first;
        a sharded checkpoint's tensors are read into the current states of the owners in
        ``states`` marked sharded (DCP reshards them), or into what the owner's
        ``load_template(has)`` gives, given which keys the checkpoint holds (``ModelState``:
        no frozen weight the checkpoint left out). The RNG file is None when this rank has
        none (saved by fewer processes)."""
        names = sharded_names(states or {})
        def template(saved: set[str] | None = None) -> dict[str, Any]:  # saved: the checkpoint's keys, if known
            return {n: _template_of(states[n], n, saved) for n in names}  # type: ignore[index]  # names come from states: none without it

        payloads = self.backend.read_checkpoint(path, template=template if names else None)
        state = payloads.get(STATE_FILE)
        if not isinstance(state, dict):
            # It may verify (its manifest lists no state.pt): resume=True steps back from it, as from one torch cannot read.
            raise UnreadableCheckpointError(f"{path}: not a training checkpoint (it has no {STATE_FILE} dict of states)")
        own = payloads.get(rng_file(self.backend.rank))
        return state, own if isinstance(own, dict) else None

    @staticmethod
    def restore(states: Mapping[str, Any], state: Mapping[str, Any], *, where: str = "the checkpoint",
                optional: Iterable[str] = ()) -> None:
        """``obj.load_state_dict(state[name])`` for each Stateful in ``states``, once every
        owner's ``check_state_dict`` (where it has one) accepted its part: a checkpoint
        that does not fit changes nothing. A name missing from ``state`` is an error
        naming it, unless it is in ``optional`` (then that owner keeps its state)."""
        optional = set(optional)
        missing = [name for name in states if name not in state and name not in optional]
        if missing:
            raise CheckpointError(f"{where} has no state for {missing} (it has {sorted(state)})")
        present = {name: obj for name, obj in states.items() if name in state}
        for name, obj in present.items():
            check = getattr(obj, "check_state_dict", None)
            if check is not None:
                check(state[name])
        for name, obj in present.items():
            obj.load_state_dict(state[name])


def sharded_names(states: Mapping[str, Any]) -> list[str]:
    """The entries whose owner marks them ``sharded`` (their tensors go through DCP)."""
    return [name for name, obj in states.items() if getattr(obj, "sharded", False)]


__all__ = ["Checkpointer", "Stateful", "StorageBackend", "rng_file", "sharded_names"]
