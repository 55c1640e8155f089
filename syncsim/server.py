"""Parameter-server hosts: their NICs, the version counter and the clock table.

The k servers each hold an equal shard of the parameters, so every push or
pull is k equal flows, one per server. All servers then see the same flows at
the same times and their NICs evolve identically: one representative link per
direction carries shards of n/k bytes and stands for all k (exact under that
symmetry). A worker's own share of its node's NICs (``Cluster.
worker_bandwidth``: its rail, divided by the fabric's oversubscription) splits
between its k concurrent shards, which caps each flow at B_worker/k; a server
NIC is shared equally by the flows it receives (or, with a ``newcomer_weight`` or
``sharing_spread``, unequally: see syncsim.network; where the workers' own links
have a bucket, a push arriving at a busy server NIC has its first bucketful
served first: SharedLink's ``sender_burst``; and with a ``crossing_stretch``, a push that comes in
while the server sends is held for the sample's next factor of that overlap; with a ``window``, a push
holds at most that many bytes queued at the server's incoming link and a reply, its acknowledgements
waiting behind them, sends at most a window per queueing delay: SharedLink's ``acks_via``). For p simultaneous
pushes one push therefore takes
alpha + max(n/B_worker, p·n/(k·B_server)): the parameter server's bottleneck.

Servers only react to arrivals, so they are modelled as these shared
resources rather than as processes of their own.
"""

from __future__ import annotations

import numpy as np
import simpy

from syncsim.cluster import Cluster
from syncsim.network import SharedLink
from syncsim.recorder import Recorder

__all__ = ["ServerGroup"]

_IN, _OUT = 0x53525649, 0x5352564F  # seed-stream tags of the two directions ("SRVI", "SRVO")
_CROSS = 0x53525658  # seed-stream tag of where the pushes start in the crossing stretches' sample ("SRVX")


class ServerGroup:
    def __init__(self, env: simpy.Environment, cluster: Cluster, recorder: Recorder, state: object,
                 seed: int = 0) -> None:
        if cluster.servers < 1:
            raise ValueError("a parameter-server scheme needs Cluster.servers >= 1 (got 0); "
                             "e.g. Cluster(..., servers=1, server_link=Link('100Gbit/s', '5us'))")
        self.env = env
        self.k = cluster.servers
        self.workers = cluster.gpus
        net = cluster.server_net
        cap = cluster.worker_bandwidth / self.k
        # A server NIC with a burst (a token-bucket shaper) passes that many bytes of the first flow after
        # an idle spell at once, whoever sends them; the workers' own buckets are not modelled. Its
        # newcomer_weight and sharing_spread say how concurrent pushes (or pulls) divide it; each direction
        # draws its flows' weights from its own stream of the run's seed (apart from syncsim.compute's).
        shaping = {"cap": cap, "burst": net.burst, "refill": net.refill_rate, "newcomer_weight": net.newcomer_weight,
                   "sharing_spread": net.sharing_spread}
        # a worker's own link (a shaper with a bucket on the testbed) lets its bucketful of a push through at
        # once, ahead of what the other pushes send after it (syncsim.network, sender_burst)
        own = cluster.inter or cluster.intra
        sender_burst = float(own.burst) / self.k if own is not None else 0.0  # split between its k shards
        # with a window (Link.window), each push holds at most that many bytes queued at the incoming link, and
        # each reply, its acknowledgements waiting behind them, sends at most a window per queueing delay
        window = float(net.window)  # type: ignore[arg-type]
        self.down = SharedLink(env, net.bandwidth, name="server-in", rng=np.random.default_rng([seed, _IN]),
                               sender_burst=sender_burst, window=window,
                               **shaping)  # type: ignore[arg-type]
        self.up = SharedLink(env, net.bandwidth, name="server-out", rng=np.random.default_rng([seed, _OUT]),
                             window=window, acks_via=self.down if window else None, **shaping)  # type: ignore[arg-type]
        # a push arriving while the server sends is held by the sample's next factor (Link.crossing_stretch): the
        # pushes take them in the order they were measured, from a start drawn from the seed, because the
        # testbed's stalls come in spells of two to four turns, which independent draws would scatter
        self.crossing = np.asarray(net.crossing_stretch, dtype=float)
        self._cross_at = int(np.random.default_rng([seed, _CROSS]).integers(max(1, self.crossing.size)))
        self.latency = float(net.latency)  # type: ignore[arg-type]
        self.service = float(cluster.server_service)  # type: ignore[arg-type]  # per push taken in, per pull answered
        self.recorder = recorder
        self.state = state
        self.clock = [0] * self.workers
        self._at_clock = {0: self.workers}  # how many workers have each clock value
        self.min_clock = 0
        self._waiters: dict[int, simpy.Event] = {}
        self._round: dict[int, list[tuple[int, int]]] = {}

    def push(self, nbytes: float) -> simpy.Event:
        moved = self.down.transfer(nbytes / self.k)
        if not self.crossing.size:
            return moved
        stretch = float(self.crossing[self._cross_at])
        self._cross_at = (self._cross_at + 1) % self.crossing.size
        return self.env.process(self._stretched(moved, stretch))

    def _stretched(self, moved: simpy.Event, stretch: float):
        """A push, held after its bytes are through (stretch − 1) times as long as the server sent while they
        came in (its sender out of window, waiting for acknowledgements; Link.crossing_stretch)."""
        crossed = self.up.busy_time()
        yield moved
        crossed = self.up.busy_time() - crossed
        if stretch > 1.0 and crossed > 0:
            yield self.env.timeout((stretch - 1.0) * crossed)

    def pull(self, nbytes: float) -> simpy.Event:
        return self.up.transfer(nbytes / self.k)

    def arrive(self, worker: int, step: int, version_read: int, aggregate: bool) -> None:
        """A worker's pushed gradient has reached the servers: apply it (or its round) and tick its clock."""
        state, now = self.state, self.env.now
        if aggregate:
            arrivals = self._round.setdefault(step, [])
            arrivals.append((worker, version_read))
            if len(arrivals) == self.workers:
                del self._round[step]
                version = state.version
                for w, read in arrivals:
                    self.recorder.update(w, step, read, version, now)
                state.version = version + 1
        else:
            self.recorder.update(worker, step, version_read, state.version, now)
            state.version += 1
        self._tick(worker)

    def _tick(self, worker: int) -> None:
        old = self.clock[worker]
        self.clock[worker] = old + 1
        at = self._at_clock
        at[old] -= 1
        at[old + 1] = at.get(old + 1, 0) + 1
        if old == self.min_clock and at[old] == 0:
            del at[old]
            self.min_clock = old + 1
            waiter = self._waiters.pop(self.min_clock, None)
            if waiter is not None:
                waiter.succeed()

    def wait(self, worker: int, slack: int) -> simpy.Event | None:
        """None if ``worker`` may proceed now, else the event that fires when the slowest catches up."""
        need = self.clock[worker] - slack
        if self.min_clock >= need:
            return None
        waiter = self._waiters.get(need)
        if waiter is None:
            waiter = self._waiters[need] = self.env.event()
        return waiter
