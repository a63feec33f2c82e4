"""Asynchronous checkpoint saves: copy the state on the training thread, write it in the background.

::

    saver = AsyncCheckpointer()
    saver.save(path, payloads, meta)   # returns once every tensor is copied to CPU memory
    ...                                # training goes on; the directory is being written
    saver.wait()                       # the write is complete (its error, if any, raised here)

The background thread calls :func:`treadle.checkpoint.io.save_checkpoint` on the copy,
so the directory is written exactly as a synchronous save writes it: payloads in a
hidden temporary directory, each fsynced, ``manifest.json`` last, one atomic rename.
A crash during the write leaves no checkpoint rather than a damaged one.

The copy (:meth:`AsyncCheckpointer.snapshot`):

* keeps the payloads' structure: containers are rebuilt (same types, an
  ``OrderedDict``'s ``_metadata`` too), tensors sharing a storage still share one, and
  views keep their offset and strides, so a CPU state's payload files are byte for
  byte those of a synchronous save;
* copies CPU tensors into fresh (or reused) CPU memory, and CUDA tensors into pinned
  host buffers with ``non_blocking`` copies ordered on the current stream: the training
  thread does not wait for the device; the writer thread waits for the copies (a CUDA
  event) before it writes. A CUDA tensor is therefore saved as a CPU tensor (the
  synchronous save records its device; loading maps to ``cpu`` by default anyway);
* reuses the previous save's buffers when the sizes match (``reuse_buffers=True``):
  no allocation or page faults after the first save, at the price of keeping one
  copy of the state in host memory between saves;
* :meth:`AsyncCheckpointer.reserve` makes the first save as cheap as the later ones:
  it allocates the buffers for a given state (pinned ones for CUDA tensors) and
  touches every page, in a background thread, so no save pays for first-touch page
  faults or ``cudaHostAlloc``. ``CheckpointHook(async_save=True)`` calls it after the
  first training iteration, when the optimizer's state exists.

At most one save is in flight: :meth:`save` first waits for the previous one. An
error of the background write is logged when it happens and raised (as a
:class:`~treadle.checkpoint.io.CheckpointError`) by the next :meth:`save`,
:meth:`wait` or :meth:`close`, never lost; a full disk or another OS error is the
:class:`~treadle.checkpoint.io.CheckpointWriteError` a synchronous save raises, marked
asynchronous. The thread is not a daemon, so a normal interpreter exit waits for the
write to finish.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from treadle.checkpoint.io import CheckpointError, CheckpointWriteError, check_save_args, save_checkpoint

__all__ = ["AsyncCheckpointer"]

logger = logging.getLogger("treadle")

# Leaves that are immutable, so the copy may share them.
_ATOMIC = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, range,
           type(Ellipsis))


class AsyncCheckpointer:
    """Checkpoint saves that block the caller only for a copy of the state.

    Args:
        reuse_buffers: copy into the previous save's buffers when the state's storages
            have the same sizes (the usual case): saves after the first allocate nothing.
    """

    def __init__(self, reuse_buffers: bool = True) -> None:
        self.reuse_buffers = reuse_buffers
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None  # of the save in flight or last done
        self._buffers: list[tuple[Tensor, bool]] = []  # (uint8 buffer, pinned) of the last snapshot, in order
        self._reserving: threading.Thread | None = None  # reserve()'s allocation thread

    # -- the caller's side ---------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], payloads: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
             on_done: Callable[[Path], Any] | None = None) -> Path:
        """Snapshot ``payloads`` now and write them to ``path`` in the background.

        Same arguments as :func:`treadle.checkpoint.io.save_checkpoint` (and checked
        the same way, here, before anything is copied). ``on_done(path)`` runs in the
        background thread after the checkpoint is complete (e.g. pruning old ones);
        its error counts as the save's. Returns ``path``.
        """
        self.wait()  # one save at a time; raises the previous save's error
        path, _, meta_json = check_save_args(path, payloads, meta)
        snap, events = self.snapshot(payloads)
        self._path = path
        self._thread = threading.Thread(target=self._write, args=(path, snap, meta_json, events, on_done),
                                        name=f"treadle-checkpoint-{path.name}", daemon=False)
        self._thread.start()
        return path

    __call__ = save  # usable wherever a save_checkpoint(path, payloads, meta=...) function is

    def wait(self) -> Path | None:
        """Block until the save in flight (if any) is written; raise its error.
        Returns the path of the last save."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointWriteError):  # disk full, EIO...: the same error as a synchronous save's
                raise error.as_asynchronous() from error
            raise CheckpointError(f"asynchronous save of {self._path} failed: {type(error).__name__}: {error}") from error
        return self._path

    @property
    def in_flight(self) -> bool:
        """True while a background write is running."""
        return self._thread is not None and self._thread.is_alive()

    def reserve(self, payloads: Mapping[str, Any], wait: bool = False) -> None:
        """Allocate (and fault in) the buffers that a snapshot of ``payloads`` will use,
        in a background thread; returns at once (``wait=True``: once it is done).

        Only the storages' sizes are read here, on the caller's thread; nothing is
        copied. The next :meth:`save` waits for the allocation if it is still going on,
        and uses the buffers if the state still has the same storage sizes (else it
        allocates, as without a reservation). Does nothing when ``reuse_buffers`` is
        False or buffers from an earlier save exist."""
        if not self.reuse_buffers or self._buffers or self._reserving is not None:
            if wait:
                self._wait_reserved()
            return
        layout = _Copier([], dry=True)
        layout.copy(payloads)
        sizes = layout.sizes
        reserved: list[tuple[Tensor, bool]] = []

        def allocate() -> None:
            try:
                for nbytes, pinned in sizes:
                    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
                    buf.fill_(0)  # touch every page now rather than during the first copy
                    reserved.append((buf, pinned))
            except Exception as e:  # e.g. no pinned memory left: the save will allocate (and say so)
                logger.warning("could not reserve checkpoint buffers in advance: %s: %s", type(e).__name__, e)
                return
            self._buffers = reserved

        self._reserving = threading.Thread(target=allocate, name="treadle-checkpoint-reserve", daemon=True)
        self._reserving.start()
        if wait:
            self._wait_reserved()

    def _wait_reserved(self) -> None:
        thread, self._reserving = self._reserving, None
        if thread is not None:
            thread.join()

    def close(self) -> None:
        """Wait for the save in flight and release the reusable buffers."""
        try:
            self._wait_reserved()
            self.wait()
        finally:
            self._buffers = []

    def __enter__(self) -> "AsyncCheckpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the copy --------------------------------------------------------------------
    def snapshot(self, payloads: Any) -> tuple[Any, list[Any]]:
        """A copy of ``payloads`` whose tensors live in CPU memory that nothing else
        uses, and the CUDA events that mark the end of the device-to-host copies.

        The copy's memory is reused by the next snapshot (``reuse_buffers``), so only
        call this while no save is in flight, and do not keep the copy past the next."""
        if self.in_flight:
            raise RuntimeError("AsyncCheckpointer.snapshot() while a save is in flight; call wait() first")
        self._wait_reserved()
        copier = _Copier(self._buffers if self.reuse_buffers else [])
        snap = copier.copy(payloads)
        events = []
        for device in copier.cuda_devices:  # the copies are queued on each device's current stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        self._buffers = copier.used if self.reuse_buffers else []
        return snap, events

    # -- the background thread -----------------------------------------------------------
    def _write(self, path: Path, snap: Any, meta: dict[str, Any], events: list[Any],
               on_done: Callable[[Path], Any] | None) -> None:
        try:
            for event in events:  # wait for the device-to-host copies to land; polling, not
                while not event.query():  # cudaEventSynchronize, keeps this thread off the device's
                    time.sleep(0.0005)  # sync accounting (set_sync_debug_mode) and the GIL free
            save_checkpoint(path, snap, meta=meta)
            if on_done is not None:
                on_done(path)
        except BaseException as e:  # kept for the caller's next save()/wait(): never lost
            self._error = e
            if isinstance(e, CheckpointWriteError):  # its message says it all
                logger.error("%s", e.as_asynchronous())
            else:
                logger.error("asynchronous checkpoint save of %s failed: %s: %s", path, type(e).__name__, e)


class _Copier:
    """One snapshot: rebuilds containers, copies each tensor storage once."""

    def __init__(self, reusable: list[tuple[Tensor, bool]], dry: bool = False) -> None:
        # dry: copy nothing, only list the buffers a copy would need (``sizes``)
        self.dry = dry
        self.sizes: list[tuple[int, bool]] = []
        self._reusable = collections.deque(reusable)
        self.used: list[tuple[Tensor, bool]] = []
        self.cuda_devices: set[torch.device] = set()
        self._memo: dict[int, Any] = {}  # id(object) -> its copy: shared objects stay shared
        self._storages: dict[Any, Any] = {}  # storage identity -> copied untyped storage

    def copy(self, obj: Any) -> Any:
        if isinstance(obj, _ATOMIC):
            return obj
        key = id(obj)
        if key in self._memo:
            return self._memo[key]
        if isinstance(obj, Tensor):
            out: Any = self._tensor(obj)
        elif isinstance(obj, dict):
            out = copy.copy(obj)  # same type; an OrderedDict keeps its attributes (state_dict _metadata)
            self._memo[key] = out
            if getattr(out, "__dict__", None):
                out.__dict__ = {k: copy.deepcopy(v) for k, v in out.__dict__.items()}
            for k, v in obj.items():
                out[k] = self.copy(v)
            return out
        elif isinstance(obj, list):
            out = []
            self._memo[key] = out
            out.extend(self.copy(v) for v in obj)
            return out
        elif isinstance(obj, tuple) and type(obj) is tuple:
            out = tuple(self.copy(v) for v in obj)
        elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            out = type(obj)(*(self.copy(v) for v in obj))
        elif isinstance(obj, (set, frozenset)):
            out = type(obj)(self.copy(v) for v in obj)
        else:  # anything else that torch.save would pickle: an independent copy
            out = copy.deepcopy(obj)
        self._memo[key] = out
        return out

    def _tensor(self, t: Tensor) -> Tensor:
        plain = type(t) in (Tensor, nn.Parameter)
        if not plain or t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda"):
            # Rare kinds (sparse, quantized, subclasses, other devices): a plain copy,
            # on the caller's thread; storage sharing is not preserved for these.
            return t if self.dry else t.detach().to("cpu", copy=True)
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        # torch.save keys storages by their StorageImpl; so do we (empty ones are never shared).
        ident = (storage.device, getattr(storage, "_cdata", storage.data_ptr())) if nbytes else None
        copied = self._storages.get(ident) if ident is not None else None
        if self.dry:  # the buffer this storage would take, unless it is shared
            if copied is None:
                self.sizes.append((nbytes, storage.device.type == "cuda"))
                if ident is not None:
                    self._storages[ident] = True
            return t
        if copied is None:
            cuda = storage.device.type == "cuda"
            buf = self._buffer(nbytes, pinned=cuda)
            src = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            buf.copy_(src, non_blocking=cuda)  # CUDA: into pinned memory, no wait on this thread
            if cuda:
                self.cuda_devices.add(storage.device)
            copied = buf.untyped_storage()
            if ident is not None:
                self._storages[ident] = copied
        out = torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, nn.Parameter):
            return nn.Parameter(out, requires_grad=t.requires_grad)
        if t.requires_grad:
            out.requires_grad_(True)
        return out

    def _buffer(self, nbytes: int, pinned: bool) -> Tensor:
        """A uint8 CPU buffer: the next reusable one if it fits exactly, else a new one."""
        if self._reusable:
            buf, was_pinned = self._reusable.popleft()
            if buf.numel() != nbytes or was_pinned != pinned:
                self._reusable.clear()  # the layout changed: allocate from here on
                buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        self.used.append((buf, pinned))
        return buf
