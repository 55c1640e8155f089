"""Calibration: every number the simulator is given, measured on this machine.

Two users: ``python -m real.calibrate`` (real.calibration.machine) measures a machine or a GPU node for
syncsim's Cluster and Workload; the testbed's validation calibrates each configuration on the emulated
network, under the run's own contention: the links' α and β, and compute. The modules:

- pure fits (no torch, no I/O): fits (straight lines; the user calibration's link_fits), link_fit (the
  testbed's links on a token bucket), sharing_fit, server_fit, compute_fit (idle cost, worker_work),
  sharded_fit (a sharded step's collectives as syncsim prices them, and the traffic factors);
- the probes, what the ranks run: link_probe, sharing_probe, compute_probe (the executor's step),
  server_probe, sharded_probe (a sharded step's gloo collectives),
  machine_probe (a training step's forward and backward, the user calibration's sweep),
  compression (the compressors' rates), timing (how a rank times a round), messages (sizes at a precision);
- cache (probe results kept as JSON, stamped with a schema version); ranks (``python -m real.calibration``,
  one rank of a probe) and machine (the user calibration's command line).

On the testbed every number has a physical meaning:

- **links**: a probe on a testbed at the configuration's rate times a ping-pong between two hosts and
  an all-reduce over every host at fp32 and each wire precision asked for, over message sizes SWEEP, each message after
  the links rested long enough to refill their tbf buckets, the sizes timed in turns (interleaved) so
  that a stall of the machine cannot take all of one size's timings; an all-reducing run is probed on as many
  hosts as it has workers. fit_links (link_fit) gives α, B and a collective's launch cost L of each closed form
  on a token-bucket link. The all-reduce fit at the scheme's precision is the link of workers that
  all-reduce (what collectives see, reduction arithmetic included), the ping-pong fit that of workers
  that push and pull and of the parameter servers (point-to-point traffic); all carry the testbed's
  bucket as their burst. A run's own all-reduce (``now``) is also timed at its size, in the minute before
  the run (the sweep is cached; a collective the cores pace drifts with the machine's load), each after
  a busy rest, and a collective's closed form passes through their trimmed mean (at_size_time: small gloo
  all-reduces here are bimodal, and a step time is a mean). A run that all-reduces twice a step
  (PowerSGD's P and Q rounds) has both timed, and one launch makes the forms' total pass through their
  timed total; top-k's exchange (an all-gather of k int32 indices, then one of k values) is timed the
  same way at the run's k (``gathers``) and priced as syncsim's ring all-gather on the ping-pong's α and
  B with a launch of its own (``allgather_<precision>``).
- **compute**: ``processes`` local ranks each time the executor's step of the configuration's scheme at
  once, as the configuration's workers do when they share this machine's cores: real.executor's own loop
  (the batch, forward and backward through DDP and its hooks, the optimizer step or the push's and
  pull's tensor work, the trace) with collectives over a group of one rank and a parameter-server client
  that sends nothing (FreeNetwork), so everything but the communication the link fits price: a
  compressor's arithmetic (PowerSGD's products and Gram-Schmidt, top-k's selection and scatter-add,
  DiLoCo's pseudo-gradient and outer step), which the executor runs inside its step, is in the compute
  time, and the workload leaves syncsim's compressor rates unset. The
  ranks meet after each step whose plan synchronises (all-reduces, averages, all-gathers or takes an
  outer step), as a run's workers leave each collective together and then compute at once. The mean
  over ranks and steps is the workload's compute time, its coefficient of variation the cluster's
  jitter, and the backward's share of the step the workload's backward_fraction (when DDP's buckets
  become ready). For a scheme with parameter servers the ranks then time steps that each follow an
  idle gap of IDLE_GAPS, each paired with a back-to-back step just before its gap: how much longer those
  take than their pairs is the workload's idle_cost, which the simulator
  adds to a step whose worker idled before it (waiting for the servers). On this machine it is most
  of a small step: the small model's 0.45 ms step took 1.04 ms after 5 ms idle, so one worker of a
  parameter server computed 1.1 ms a step in runs where the back-to-back probe said 0.67 ms. Workers
  that wait for a collective are not idle (gloo's threads reduce in their process): in a grid that
  charged them the sleep-measured cost, two all-reducing workers of the small model were simulated at
  2.7-2.9 ms a step's compute where their runs computed 1.1-1.2 ms. For a run with a straggler the probe's last rank
  is slowed as ``--slow RANK:F`` slows the run's last worker (real.executor: a sleep of (F-1) x 3 x its
  forward time, timed warm once, between forward and backward), and its step is reported apart
  (``slowed_time``), with the forward its sleep was sized from (``slow_forward``), which the run is
  given so that it sleeps as long: the slowed step sets that worker's speed factor in the simulator,
  measured rather than derived, since compute right after a sleep is slower than back to back (the same
  effect as the idle cost's).
  Schemes whose workers do the same work (the parameter servers' synchronous, asynchronous and SSP
  modes) share one compute probe (worker_work).

Results are cached as JSON under the calibration folder (cache), so a resumed study measures nothing twice.
``python -m real.calibration --probe|--compute|--sharing|--server|--machine ...`` is what the ranks run.
"""
