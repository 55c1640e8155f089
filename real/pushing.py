"""The executor's handlers for the parameter-server actions: Push, WaitForClock, Pull.

A mixin of real.executor.Executor (its state: the model, the recorder, the byte counts and the clock),
kept in a module of its own as real/compressed.py and real/sharded.py are; the dispatch is the
executor's (one handler per action type, docs/architecture.md). The protocol itself, each message and
its tag, is real.server's Client.
"""

from __future__ import annotations

import torch

from real.server import Client
from syncsim.schemes import SERVER_ACTIONS, Pull, Push, WaitForClock

__all__ = ["PushPullHandlers"]


class PushPullHandlers:
    """Push, WaitForClock and Pull over this rank's parameter-server client."""

    def _setup_client(self, kinds: set, client=None) -> None:
        """The rank's client when the plan talks to the servers: ``client`` if given, else one over the
        run's process group."""
        self.client = None
        if kinds.intersection(SERVER_ACTIONS):
            numel = sum(p.numel() for p in self.model.parameters())
            self.client = client if client is not None else Client(self.cfg.world, self.cfg.servers, numel,
                                                                   self.wire_dtype)

    def push(self, action: Push) -> None:
        start = self.recorder.now()
        grads = [p.grad.reshape(-1) for p in self.model.parameters()]
        flat = torch.cat(grads).float()
        with self.heartbeat.waiting_for_peers():
            nbytes = self.client.push(flat.cpu(), self.step, action.aggregate)
        self.clock += 1
        self.bytes_sent += nbytes
        self.recorder.span(self.worker, self.step, "push", start, self.recorder.now(), nbytes)

    def wait(self, action: WaitForClock) -> None:
        start = self.recorder.now()
        with self.heartbeat.waiting_for_peers():
            self.client.wait(self.step, self.clock - action.slack)
        self.recorder.span(self.worker, self.step, "wait", start, self.recorder.now())

    def pull(self, action: Pull) -> None:
        start = self.recorder.now()
        with self.heartbeat.waiting_for_peers():
            flat, nbytes = self.client.pull(self.step)
        self._load_flat(flat.to(self.device))
        self.bytes_sent += nbytes
        self.recorder.span(self.worker, self.step, "pull", start, self.recorder.now(), nbytes)
