"""DDP communication hooks: torch's own, wrapped to count bytes, time buckets and defer launch.

torch's comm-hook pattern (torch.distributed.algorithms.ddp_comm_hooks): a
hook is ``hook(state, bucket) -> Future[Tensor]`` and variants wrap rather
than copy (``fp16_compress_hook`` wraps the all-reduce). We wrap torch's
``allreduce_hook`` / ``fp16_compress_hook`` / ``bf16_compress_hook`` once more
to (a) count the payload bytes each bucket puts on the wire, (b) note when the
first bucket became ready and (c) when a step's action says no bucket is ready
before the end of backward (``AllReduceGradients.ready`` all 1.0, i.e. the
scheme's ``overlap=false``), hold every bucket until the last one and launch
them together.

bf16: torch documents ``bf16_compress_hook`` as needing NCCL >= 2.9.6, but in
torch 2.13 it is the same cast-all-reduce-cast as the fp16 hook
(``default_hooks._compress_hook``) and gloo all-reduces bfloat16 tensors (checked
here on gloo), so the same wrapped hook serves both backends.
"""

# No `from __future__ import annotations` here: DDP's register_comm_hook
# checks the hook's annotations against the real dist.GradBucket and
# torch.futures.Future types, which string annotations would fail.
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from real.wire import value_bytes

__all__ = ["CountingHookState", "counting_hook"]

_INNER = {
    "fp32": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


class CountingHookState:
    """User knobs (group, precision) apart from per-step internal state, as torch's hook states do."""

    def __init__(self, process_group, precision: str, all_launched=None):
        self.process_group = process_group
        self.all_launched = all_launched  # called once a step's last bucket is launched
        self.inner = _INNER[precision]
        self.itemsize = value_bytes(precision)
        self.defer = False
        self.reset()

    def reset(self) -> None:
        self.bytes = 0
        self.buckets = []  # wire bytes of each bucket this step, in launch order
        self.first_ready = None
        self.last_ready = None
        self.held = []


def counting_hook(state: CountingHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    now = time.time()
    state.first_ready = now if state.first_ready is None else state.first_ready
    state.last_ready = now
    # Payload = the bucket's values in the wire dtype: what the inner hook
    # hands to all_reduce (the fp16/bf16 hooks cast the whole flat buffer).
    nbytes = bucket.buffer().numel() * state.itemsize
    state.bytes += nbytes
    state.buckets.append(nbytes)
    if bucket.is_last() and state.all_launched is not None:
        state.all_launched()
    if not state.defer:
        return state.inner(state.process_group, bucket)
    # DDP calls hooks in bucket-index order and waits for every future at the
    # end of backward, so a bucket may return an unfinished future that the
    # last bucket's call completes.
    held = torch.futures.Future()
    state.held.append((bucket, held))
    if bucket.is_last():
        for b, fut in state.held:
            state.inner(state.process_group, b).then(lambda done, fut=fut: fut.set_result(done.value()))
        state.held = []
    return held
