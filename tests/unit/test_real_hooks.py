"""real/hooks.py in process: what the counting hook counts, and when it launches each bucket.

The all-reduce itself is torch's hook (tests/real check its numbers against a
reference); here a recording stand-in takes its place, so the wrapper's own
rules are checked exactly: bytes in the wire dtype per bucket, the first and
last readiness times, and, with overlap off, every bucket held until the last
one is ready and then launched in order.
"""

from __future__ import annotations

import torch

from real.hooks import CountingHookState, counting_hook


class Bucket:
    """The two calls the hook makes on torch's GradBucket."""

    def __init__(self, values: list[float], last: bool):
        self.values, self.last = torch.tensor(values), last

    def buffer(self) -> torch.Tensor:
        return self.values

    def is_last(self) -> bool:
        return self.last


def recording_state(precision: str, defer: bool) -> tuple[CountingHookState, list]:
    state = CountingHookState(process_group=None, precision=precision)
    launched = []

    def inner(group, bucket):
        launched.append(bucket)
        done = torch.futures.Future()
        done.set_result(bucket.buffer() * 10)  # a stand-in result, to see it handed back
        return done

    state.inner, state.defer = inner, defer
    return state, launched


def test_overlapped_buckets_launch_as_they_become_ready():
    state, launched = recording_state("fp32", defer=False)
    first, last = Bucket([1.0, 2.0], False), Bucket([3.0], True)
    future = counting_hook(state, first)
    assert launched == [first] and future.done()  # launched and finished before the next bucket exists
    assert future.wait().tolist() == [10.0, 20.0]
    counting_hook(state, last)
    assert launched == [first, last]
    assert state.buckets == [8, 4] and state.bytes == 12  # fp32: four bytes a value
    assert state.first_ready <= state.last_ready


def test_held_buckets_launch_together_once_the_last_is_ready(monkeypatch):
    monkeypatch.setattr("real.hooks.time.time", iter([1.0, 2.0, 3.0]).__next__)  # each bucket's readiness
    state, launched = recording_state("bf16", defer=True)
    buckets = [Bucket([1.0, 2.0, 3.0], False), Bucket([4.0], False), Bucket([5.0, 6.0], True)]
    futures = [counting_hook(state, buckets[0]), counting_hook(state, buckets[1])]
    assert launched == [] and not any(f.done() for f in futures)
    futures.append(counting_hook(state, buckets[2]))
    assert launched == buckets  # all of them, in bucket order
    assert [f.wait().tolist() for f in futures] == [[10.0, 20.0, 30.0], [40.0], [50.0, 60.0]]
    assert state.buckets == [6, 2, 4] and state.bytes == 12 and state.held == []  # bf16: two bytes a value
    assert (state.first_ready, state.last_ready) == (1.0, 3.0)


def test_overlap_is_the_default_until_a_step_says_otherwise():
    assert CountingHookState(process_group=None, precision="fp32").defer is False


def test_reset_forgets_the_last_step():
    state, _ = recording_state("fp16", defer=False)
    counting_hook(state, Bucket([1.0], True))
    state.reset()
    assert (state.bytes, state.buckets, state.first_ready, state.last_ready, state.held) == (0, [], None, None, [])
