"""``python -m real.calibrate --model NAME --world N --out FILE.json``: measure this setup for syncsim.

Writes ``{"cluster": ..., "workload": ..., "fit": ...}``: ``Cluster.from_json``
and ``Workload.from_json`` read the first two keys, so ``simulate`` predicts
this very setup; "fit" keeps the raw sweeps and the quality of each fit.

- Compute (``measure_forward_backward``): ``Workload.from_torch`` times forward
  and backward of one batch (median of repeats), without and with autocast (bf16 on CPU, fp16 on CUDA),
  once alone and once on every rank at the same time; the concurrent time
  (what a rank of a real run gets when ranks share cores and memory) becomes
  the workload's ``compute_time``, and ``--amp`` picks which. Threads: as many
  as a rank gets under real.run (OMP_NUM_THREADS, 1 by default).
- Network: ``world`` ranks (at least 2) started by torch's launcher run a
  ping-pong between ranks 0 and 1 and an all-reduce over all ranks, over
  message sizes from 1 KiB to 64 MiB. Each curve is fitted by least squares
  to the closed form the simulator uses (syncsim.collectives): one-way
  ``t = α + n/B`` and ring all-reduce ``t = L + 2(p-1)·α + 2(p-1)/p · n/B``.
  The ping-pong's α is the per-hop latency; the all-reduce's intercept less
  2(p-1) such hops is L, the fixed cost of one collective
  (``Cluster.collective_latency``), and its slope gives the bandwidth
  collectives reach. The fit weighs each point by 1/t (least squares on
  relative error), else the 64 MiB points decide everything and α comes out
  as noise; R² and relative residuals are reported. The worker link takes
  the per-hop α and the all-reduce bandwidth (what collectives see), the
  server link the ping-pong fit (what point-to-point pushes see).
- Compression (``measure_compression``): the rates at which a worker does a compressor's own work,
  the workload's ``compress_flops`` and ``scan_rate``, timed on what runs it: the executor carries
  out PowerSGD and top-k with syncsim.compression, numpy in float64 on the CPU, with as many BLAS
  threads as a rank gets. ``compress_flops``: PowerSGD's thin products P = MQ, Q = MᵀP and PQᵀ at
  the model's own matrix shapes and ``--rank`` (6·rows·cols·r FLOPs a matrix, over their time).
  ``scan_rate``: values/s of a partition of a gradient of the model's size around its top 1 %
  (top-k's costliest pass). Timed alone and on every rank at once, as compute is; the workload
  takes the concurrent rates. As a check, the whole of top-k's and PowerSGD's per-worker work
  (syncsim.compression's Sparsifier and LowRank, stage by stage) is timed too and set beside what the
  simulator charges for it at those rates (syncsim.engine.compression_work).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from real.calibration.compression import measure_compression
from real.calibration.fits import link_fits
from real.calibration.machine_probe import MAX_REPEATS, measure_forward_backward
from syncsim.arguments import ArgumentParser, check_count, fail, integer
from syncsim.files import check_out_file
from syncsim.limits import MAX_GPUS, check_memory

__all__ = ["main", "measure_network"]


def measure_network(world: int, repeats: int, model_name: str, batch_size: int, rank: int = 1) -> dict:
    """The user calibration's probe on ``world`` local ranks (at least 2; real.calibration.machine_probe):
    what its rank 0 wrote."""
    from real.run import start_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.json")
        start_ranks(max(2, world), "real.calibration", ["--machine", out, "--repeats", str(repeats),
                                                        "--model", model_name, "--batch-size", str(batch_size),
                                                        "--powersgd-rank", str(rank)])
        return json.loads(Path(out).read_text())


def _parser() -> ArgumentParser:
    from real.config import MODELS

    ap = ArgumentParser(prog="python -m real.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lenet", choices=MODELS)
    ap.add_argument("--world", type=integer, default=2, help="ranks in the network sweep (>= 2)")
    ap.add_argument("--servers", type=integer, default=0, help="parameter-server hosts to put in the cluster")
    ap.add_argument("--batch-size", type=integer, default=32)
    ap.add_argument("--amp", action="store_true", help="use the autocast compute time as the workload")
    ap.add_argument("--repeats", type=integer, default=7)
    ap.add_argument("--rank", type=integer, default=1,
                    help="PowerSGD rank whose thin products set compress_flops (torch's default: 1)")
    ap.add_argument("--out", default="results/real/calibration.json")
    return ap


def _check(args) -> None:
    """The same bounds as a real run's, then the output file: all before anything is measured."""
    from real.config import RunConfig
    from real.run import RANK_BYTES

    RunConfig(world=args.world, servers=0, model=args.model, batch_size=args.batch_size, out=tempfile.gettempdir())
    check_count("--servers", args.servers, 0, MAX_GPUS)
    check_count("--repeats", args.repeats, 1, MAX_REPEATS)
    check_count("--rank", args.rank, 1, 2**20)
    check_memory("real.calibrate", max(2, args.world), "ranks on this machine", RANK_BYTES, "lower --world")
    check_out_file(args.out)


def main(argv: list[str] | None = None) -> int:
    """The user calibration's command line (the module's docstring); 0, or 2 for bad input."""
    args = _parser().parse_args(argv)
    try:
        _check(args)
    except ValueError as err:
        return fail("real.calibrate", err)
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    plain = measure_forward_backward(args.model, args.batch_size, amp=False)
    mixed = measure_forward_backward(args.model, args.batch_size, amp=True)
    compression = measure_compression(args.model, args.rank, args.repeats, threads)
    net = measure_network(args.world, args.repeats, args.model, args.batch_size, args.rank)
    fit = {"model": args.model, "batch_size": args.batch_size, "threads": threads, "torch": torch.__version__,
           "compute": {name: {"compute_time": w.compute_time, "backward_fraction": w.backward_fraction,
                              "compute_time_concurrent": net["compute_concurrent"][name]}
                       for name, w in (("fp32", plain), ("amp", mixed))},
           "compression": compression | {"concurrent": net["compression_concurrent"]}}
    fit.update(link_fits(net))
    _write(args, fit, mixed if args.amp else plain, net)
    _report(args, fit, plain, mixed, net)
    return 0


def _write(args, fit: dict, workload, net: dict) -> None:
    """Write ``args.out``: the cluster of the fitted links, the workload at the concurrent compute time and
    compressor rates (what a rank of a real run gets), and the fit."""
    from real.trace import write_atomic
    from syncsim.cluster import Cluster, Link

    link = Link(bandwidth=fit["allreduce"]["bandwidth"], latency=fit["allreduce"]["alpha"])
    server_link = Link(bandwidth=fit["pingpong"]["bandwidth"], latency=fit["pingpong"]["alpha"])
    cluster = Cluster.homogeneous(gpus=args.world, link=link, servers=args.servers,
                                  server_link=server_link if args.servers else None, name="calibrated",
                                  collective_latency=fit["allreduce"]["launch"])
    # The workload takes the time measured with all ranks computing at once:
    # that is what a rank of a real run gets.
    workload = workload.replace(compute_time=net["compute_concurrent"]["amp" if args.amp else "fp32"],
                                **net["compression_concurrent"])  # compress_flops, scan_rate: every rank at once
    write_atomic(args.out, json.dumps({"cluster": cluster.to_dict(), "workload": workload.to_dict(), "fit": fit},
                                      indent=1))


def _report(args, fit: dict, plain, mixed, net: dict) -> None:
    """What was measured, a line for compute, the compressors' rates, their check and each link."""
    p, concurrent, compression = net["world"], net["compute_concurrent"], fit["compression"]
    print(f"real.calibrate: {args.model} batch {args.batch_size}: compute {plain.compute_time * 1e3:.2f} ms alone, "
          f"{concurrent['fp32'] * 1e3:.2f} ms with {p} ranks computing (backward {plain.backward_fraction:.0%}); "
          f"with autocast {mixed.compute_time * 1e3:.2f} ms alone, {concurrent['amp'] * 1e3:.2f} ms with {p} ranks")
    rates, check = net["compression_concurrent"], compression["check"]
    flops_text = (f"{compression['compress_flops'] / 1e9:.2f} GFLOP/s alone, {rates['compress_flops'] / 1e9:.2f} "
                  f"with {p} ranks" if rates["compress_flops"] else "not measured (no matrix)")
    print(f"real.calibrate: compression: thin products (rank {args.rank}, {len(compression['matrices'])} matrices) "
          f"{flops_text}; scan {compression['scan_rate'] / 1e6:.1f} M values/s alone, "
          f"{rates['scan_rate'] / 1e6:.1f} with {p} ranks (partition of {compression['values']:,} values)")
    print(f"real.calibrate: compression check, one worker alone: top-k's own work "
          f"{check['topk']['measured'] * 1e3:.2f} ms measured, {check['topk']['priced'] * 1e3:.2f} ms priced at "
          f"these rates; PowerSGD's "
          f"{check['powersgd']['measured'] * 1e3:.2f} ms measured, {check['powersgd']['priced'] * 1e3:.2f} ms priced")
    for name in ("allreduce", "pingpong"):
        f = fit[name]
        launch = f" + launch {f['launch'] * 1e6:.1f} us" if "launch" in f else ""
        print(f"real.calibrate: {name}: alpha {f['alpha'] * 1e6:.1f} us/hop{launch}, "
              f"B {f['bandwidth'] / 1e9:.3f} GB/s, R² {f['r2']:.4f}, "
              f"max |relative residual| {max(map(abs, f['relative_residuals'])):.2f}")
    print(f"real.calibrate: wrote {args.out}")
