"""pydist's own engine for CUDA tensors (issue 38): the pieces that need no CUDA, checked on the CPU.

Off by default: PYDIST_CUDA_ENGINE=1 asks for it; nothing calls these pieces yet, so today
the torch plugin's init only warns that it is not available (CUDA tensors still go where
PYDIST_CUDA says). No piece here imports torch or CUDA: each takes the device's
operations as callables, which the CUDA layer will supply and tests fake.

- ``staged_schedule``: a tensor cut in chunks, each copied down to a host buffer, through
  the host step, and back up; three chunks in flight (down, network, up).
- ``pinned_pool``: the bounded, reused pool of host staging buffers (one per group).
- ``ipc_cache``: peers' segments mapped by CUDA IPC, cached per (peer, segment), LRU,
  invalidated when a peer frees a segment; refuses to re-share a mapped tensor.
- ``handle_exchange``: the records the ranks of a host exchange per call (segment handle,
  offset, event, freed segments), their wire form, and the all-gather that carries them.

What the CUDA layer still has to supply, none of it run on a GPU yet:

- pinned_pool ``allocate``/``free``: ``torch.empty(n, dtype=torch.uint8, pin_memory=True)``
  and dropping it (cudaHostAlloc / cudaFreeHost under torch's host allocator).
- staged_schedule ``copy_down``: on the group's own ``torch.cuda.Stream``, after
  ``stream.wait_event(e)`` for an event ``e`` recorded on the caller's current stream,
  ``buffer[:n].copy_(tensor_bytes[chunk], non_blocking=True)`` (cudaMemcpyAsync D2H), then
  ``torch.cuda.Event().record(stream)`` as its Pending.
- staged_schedule ``copy_up``: the same stream, ``tensor_bytes[chunk].copy_(buffer[:n],
  non_blocking=True)`` (H2D), an event recorded after it; at the end the caller's stream
  waits on the last one (``current_stream().wait_event``) and ``tensor.record_stream(stream)``.
- Pending ``wait(deadline)``: a loop on ``event.query()`` with sleeps, against the deadline
  (never ``event.synchronize()``, which cannot time out).
- ipc_cache ``open_handle``: ``torch.multiprocessing.reductions.rebuild_cuda_tensor`` (or
  ``torch.UntypedStorage._new_shared_cuda``) on the peer's handle: cudaIpcOpenMemHandle;
  ``close_mapping``: dropping that storage (cudaIpcCloseMemHandle), then
  ``torch.cuda.ipc_collect()`` on the producer side; ``local_address``: ``data_ptr()``.
- handle_exchange's records: ``reduce_tensor(t)`` / ``storage._share_cuda_()`` for the
  segment handle, base, length and offset; ``torch.cuda.Event(interprocess=True)`` and
  ``.ipc_handle()`` for the event, ``Event.from_ipc_handle(device, handle)`` and
  ``stream.wait_event`` on the peer; the freed list from the caching allocator (a
  ``torch.cuda.memory`` allocator trace hook on segment free).
- The on-GPU collectives over mapped peer memory (one-shot / reduce-scatter + all-gather
  all_reduce, broadcast, all_gather, ... as device copies and sums) and the torch plugin's
  dispatch of a CUDA tensor to this engine: not written yet.
"""
from __future__ import annotations
