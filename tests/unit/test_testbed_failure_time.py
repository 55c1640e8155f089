"""A testbed run judges its silent ranks at the instant a node was first seen failed, not after the grace."""

from __future__ import annotations

import json
import types

from real.config import RunConfig
from real.testbed import launcher


def test_a_failed_run_is_judged_when_its_first_node_was_seen_failed(monkeypatch, tmp_path):
    # A rank killed while computing has a heartbeat in its work phase; judged after FAILURE_GRACE and the
    # stop (5-10 s later) it would read as hung under a 4 s timeout (real.failure), judged when its node
    # was seen to fail it reads as killed. run() must hand finish() the time torchrun_on recorded.
    seen_failed = 1_700_000_000.25
    cfg = RunConfig(scheme="allreduce", world=2, model="mlp", steps=2, out=str(tmp_path / "run"))
    (tmp_path / "run" / "testbed").mkdir(parents=True)
    (tmp_path / "run" / "testbed" / launcher.FAILED_AT_FILE).write_text(json.dumps(123.0))  # a stale record

    def torchrun_on(bed, module, argv, log_dir, timeout, agent=True, fork=True):
        assert not (log_dir / launcher.FAILED_AT_FILE).exists(), "a previous run's record must be removed"
        (log_dir / launcher.FAILED_AT_FILE).write_text(json.dumps(seen_failed))
        return [0, 1]

    calls = []
    monkeypatch.setattr(launcher, "torchrun_on", torchrun_on)
    monkeypatch.setattr("real.run.finish", lambda cfg, exits, fallback, **kw: calls.append(kw) or "failed")
    bed = types.SimpleNamespace(config=types.SimpleNamespace(hosts=2), describe=lambda: {"hosts": 2})
    code, _ = launcher.run(bed, cfg)
    assert code == 1 and calls == [{"failed_at": seen_failed}]
    # and, failed or not, the run's record holds the network it had (Testbed.describe)
    assert json.loads((tmp_path / "run" / "testbed" / launcher.NETWORK_FILE).read_text()) == {"hosts": 2}
