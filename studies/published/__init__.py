"""Predicted against published: nccl-tests all-reduce curves, data-parallel scaling and sharded (FSDP, ZeRO)
throughput on stated hardware (docs/published.md).

``python -m studies.published [--out DIR] [--jobs N] [--scheduler ADDRESS]`` reads every dataset under
``tests/data/published/`` (a CSV of measured rows and a JSON saying where they
come from and on what hardware; see that folder's README), builds the
dataset's cluster from the hardware *as stated* through the component table
(``studies.published.components``) — the same physical constants for every dataset, each cited, never a
factor chosen per dataset or row — predicts each row with syncsim (a training
row runs its dataset's scheme, or its own where the CSV has a ``scheme``
column: DiLoCo, local SGD, PowerSGD, ...; at the stated link rate, or the row's
own ``nic_rate``), and writes to ``results/published/``:

- ``published.csv``: one row per measured row: dataset, source, what was
  measured (an all-reduce's time, a scaling efficiency, or a sharded run's
  tokens/s per GPU), the scheme and link rate a training row ran, predicted,
  measured, relative error, the algorithm that ran, whether the row is
  bandwidth-bound and whether it is inside the model (with the reason when
  not), and for a sharded row whether it calibrated its configuration's
  compute efficiency (``calibration``) and that efficiency
  (``compute_efficiency``);
- ``parity.png``: predicted against measured, drawn from the CSV.

Bandwidth-bound rows are all-reduces of at least 64 MiB and training
configurations whose step is communication-bound (the all-reduce of one
step's gradients, uncontended, takes at least as long as its compute; for a
scheme that synchronises every ``period`` steps, that all-reduce divided by the
period; for a sharded scheme, its step's gathers and reduce-scatters one after
another, ``step_communication``). The summary's headline is their error inside the model; it also gives the rows
inside the model that are not bandwidth-bound (latency-bound all-reduces,
compute-bound training), and for every dataset outside the model its error
and the headline had it been included. A dataset is outside the model when
its hardware states no GPUDirect RDMA on a run that crosses the network
(``host_staged``), or when it ran what the model leaves out (``OUTSIDE``:
NVLink SHARP, model parallelism, ...).

Sharded data parallelism (``zero:stage=N``, ``fsdp:...``; tokens/s per GPU).
No source of these datasets publishes a run without communication, the
single-GPU baseline the data-parallel datasets take their compute time from,
so the compute time per step is derived from physics, by one rule for every
dataset (``sharded_rows``):

    compute time = FLOPs per step / (peak × e),
    FLOPs per step = F(decoder, T) × T × batch per GPU,

with F PaLM's training FLOPs per token, 6N + 12·L·H·Q·T (N the parameters in
matrix products, L layers, H query heads of Q dimensions, T the sequence;
``syncsim.decoders.decoder_train_flops_per_token``, parameter counts from each
model's published configuration, ``DECODERS``), the peak the GPU's datasheet
gives (``syncsim.workload.PEAK_FLOPS``), and e one compute efficiency per
compute configuration of a dataset: its rows with the same ``technique`` (what
changes the kernels: torch.compile, float8 matmuls; all rows where there is no
such column). e is calibrated on that configuration's smallest-scale row (fewest
GPUs), declared in the CSV's output as ``calibration``: e = that row's measured
tokens/s per GPU × F / peak, its model-FLOP utilisation, i.e. its measured
throughput is taken as compute, as the data-parallel datasets take their
single-GPU run's. e is then held fixed for every other row of the
configuration, which the simulator predicts with the dataset's own scheme and
network. The peak cancels (compute time = F·T·batch / (tokens/s × F) of the
calibration row when the model and sequence are the same), so a GPU whose
exact peak is not stated (Meta's 500 W H100) costs nothing but the reported
efficiency. Calibration rows are reported, never counted in an error. A
dataset that lacks what the rule needs (the network, an absolute throughput to
calibrate on, the model, sequence or batch of each row) carries no
``model.compute`` and keeps ``model.no_prediction`` saying which.

Modules: ``dataset`` (a dataset, and whether the model covers it), ``components`` (the component
table), ``rows`` (one output row), ``predict`` (all-reduce and data-parallel rows, and the sweep's
configuration), ``sharded`` (the sharded rows), ``summary`` and ``plot`` (what the study reports),
``study`` (``main``).
"""
