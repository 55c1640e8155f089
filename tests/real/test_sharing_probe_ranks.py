"""The sharing probe's ranks exchange their instants once, after the last collision (real.calibration.sharing_probe)."""

from __future__ import annotations

import json
import os

import pytest
import torch.multiprocessing as mp

from tests.real.test_compute_calibration import _free_port

REPEATS, SIZE = 2, 4096


def _probe_rank(rank: int, port: int, out: str) -> None:
    """One of three ranks of the sharing probe on loopback, counting the object gathers it makes."""
    import torch.distributed as dist

    from real.calibration import sharing_probe

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="3")
    gathers = []
    real_gather = dist.all_gather_object

    def counted(*args, **kwargs):
        gathers.append(1)
        return real_gather(*args, **kwargs)

    dist.all_gather_object = counted
    sharing_probe.sharing_rank(out, SIZE, REPEATS, idle=1e-3, lone=1e-3)
    with open(f"{out}.gathers{rank}", "w") as f:
        f.write(str(len(gathers)))


@pytest.mark.distributed
def test_the_sharing_probe_exchanges_its_instants_once_after_the_last_collision(tmp_path):
    # Each collision's instants used to be gathered right after it, by an all-gather ring in which one peer
    # sends to the host and the other receives from it; the next collision of two gloo pushes then split
    # differently (at 200 Mbit/s the first of two 1.7 MB pushes a quarter of a transfer apart took a
    # median 130 ms with the exchange and 116 ms without; docs/log.md). So no rank gathers between the
    # collisions: one gather for all of them and one for the turns that follow, however many trials,
    # and every trial still carries each of its flows' start and end, as each instant's one rank took it.
    from real.calibration.sharing_probe import SHARING_OFFSETS, turns

    out = tmp_path / "sharing.json"
    mp.spawn(_probe_rank, args=(_free_port(), str(out)), nprocs=3, join=True)
    assert [int((tmp_path / f"sharing.json.gathers{r}").read_text()) for r in range(3)] == [2, 2, 2]
    trials = json.loads(out.read_text())
    colliding = [t for t in trials if t["pattern"] != "turns"]
    assert [(t["pattern"], t["fraction"]) for t in colliding] == [
        (p, f) for p in ("into", "out") for f in SHARING_OFFSETS for _ in range(REPEATS)]
    assert len(trials) - len(colliding) == turns(1e-3)
    for t in trials:
        assert all(s == s and e == e and e > s for s, e in zip(t["starts"], t["ends"])), t  # no NaN left
