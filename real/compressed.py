"""The executor's handlers for the actions that trade bytes for arithmetic: PowerSGD, top-k, DiLoCo.

A mixin of real.executor.Executor (its state: the model, the recorder, the byte and version counts),
kept in a module of its own so that each executor module stays small; the dispatch is the executor's
(one handler per action type, docs/architecture.md).

- LowRankAllReduce (PowerSGD) and SparseAllGather (top-k): the backward runs
  without DDP; the flat gradient goes to the rank's compressor from
  syncsim.compression (numpy, on the CPU: the numerics the replay runs too),
  and between its stages the rank all-reduces (then divides by W: the mean) or
  all-gathers what the compressor hands it, cast to the wire dtype. The
  gradient the compressor returns is written into ``.grad`` and the optimizer
  steps. No bucket overlap (the simulator models none either). The
  compressor's work before the first collective (error feedback, P = ΔQ and
  its orthogonalisation; the top-k selection) is a ``compute`` row of its
  own, so a collective's row times the exchange: a calibrated workload
  counts that work as compute (real.calibration.compute_probe), and the
  validation study's replay (real.validation.prediction.replayed_compute)
  takes the run's compute from those rows (docs/log.md, "The compressor's
  work and a sharded step's collectives in the replay"). PowerSGD's
  Q = ΔᵀP̂ between the rounds stays in the second round's row (a compute row
  between two all-reduce rows would break the simulator's order of
  actions, which has none there); the decompression after the last round
  (P̂Qᵀ, top-k's scatter-add) and the optimizer step fall between that row
  and the next step's compute, which the replay counts as compute.
- OuterStep (DiLoCo): the mean over workers of (the fragment's last outer
  value − its value now), all-reduced at the wire dtype, is the gradient of an
  outer torch.optim.SGD (Nesterov when momentum > 0) that steps a separate
  copy of the fragment's last outer value; every replica's fragment then takes
  the result.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from real.models import flat_params
from syncsim.compression import LowRank, Sparsifier, layout, scatter_mean
from syncsim.schemes import LowRankAllReduce, OuterStep, SparseAllGather
from syncsim.schemes.diloco import fragment_bounds
from syncsim.schemes.topk import top_k

__all__ = ["CompressedHandlers"]


class CompressedHandlers:
    """PowerSGD's, top-k's and DiLoCo's handlers and their per-rank state (compressors, outer copies)."""

    def _setup_compressors(self, actions) -> None:
        """One compressor (syncsim.compression) per distinct compressing action of the plan: this rank's
        error-feedback residual and PowerSGD's warm-started Q, kept over the run. What it sends is rounded to
        the wire's precision by the replay's own rounding (syncsim.convergence.wire), so that the residual
        keeps exactly what the replay's does; at fp16/bf16 the cast to the wire dtype is then exact, at fp32
        it rounds float64 to float32 (the replay keeps float64: float32 drift)."""
        self.compressors: dict = {}
        compressing = [a for a in actions if isinstance(a, (LowRankAllReduce, SparseAllGather))]
        if not compressing:
            return
        from syncsim.convergence.wire import Wire  # imports pandas: only on ranks that compress

        send = Wire(self.spec.precision).send
        numel = sum(p.numel() for p in self.model.parameters())
        for action in compressing:
            if isinstance(action, LowRankAllReduce):
                segments = layout(self.shapes, action.rank, action.min_compression)
                self.compressors[action] = LowRank(segments, seed=self.cfg.seed, send=send)
            else:  # k as the action has it, or its share of this model's size if the plan was sized otherwise
                k = action.values if action.size == numel else top_k(numel, action.ratio)
                self.compressors[action] = Sparsifier(numel, k, send=send)

    def _setup_outer(self, actions) -> None:
        """For each fragment an OuterStep synchronises: a separate copy of its last outer value (at first the
        initial parameters, the same on every rank) and the outer SGD that steps that copy."""
        self.outer: dict = {}
        numel = sum(p.numel() for p in self.model.parameters())
        initial = flat_params(self.model)
        for action in (a for a in actions if isinstance(a, OuterStep)):
            for fragment in action.fragments:
                bounds = fragment_bounds(numel, action.count)[fragment]
                if bounds in self.outer:
                    continue
                anchor = initial[bounds[0]:bounds[1]].clone().to(self.device).requires_grad_(True)
                outer = torch.optim.SGD([anchor], lr=action.lr, momentum=action.momentum,
                                        nesterov=action.momentum > 0)
                self.outer[bounds] = (anchor, outer)


    # -- handlers ----------------------------------------------------------------------------
    def _flat_grad(self) -> np.ndarray:
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).double().cpu().numpy()

    def _set_grad(self, flat: np.ndarray) -> None:
        values = torch.from_numpy(flat).to(self.device, torch.float32)
        offset = 0
        for p in self.model.parameters():
            p.grad.copy_(values[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def _mean(self, values: np.ndarray) -> tuple[np.ndarray, int]:
        """(the mean over workers of ``values``, bytes sent): cast to the wire dtype, all-reduced (the sum),
        divided by W in float64."""
        if values.size == 0:
            return values, 0
        wire = torch.from_numpy(values).to(self.device, self.wire_dtype)
        with self.heartbeat.waiting_for_peers():
            dist.all_reduce(wire, group=self.group)
        return wire.double().div_(self.cfg.world).cpu().numpy(), wire.numel() * wire.element_size()

    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(tensor) for _ in range(self.cfg.world)]
        with self.heartbeat.waiting_for_peers():
            dist.all_gather(parts, tensor, group=self.group)
        return parts

    def _applied(self, gradient: np.ndarray) -> None:
        """Apply the gradient every replica applies this step: one new version, as an all-reduce step."""
        self._set_grad(gradient)
        self._apply()
        self.recorder.update(self.worker, self.step, self.read_version, self.version, self.recorder.now())
        self.version += 1

    def low_rank(self, action: LowRankAllReduce) -> None:
        compressor = self.compressors[action]
        begun = self.recorder.now()
        plain, ps = compressor.start(self._flat_grad())
        start = self.recorder.now()
        self.recorder.span(self.worker, self.step, "compute", begun, start)
        # round one: the uncompressed values and every P, in one all-reduce
        first, sent = self._mean(np.concatenate([plain, *(p.reshape(-1) for p in ps)]))
        plain_mean, offset, p_means = first[:plain.size], plain.size, []
        for p in ps:
            p_means.append(first[offset:offset + p.size].reshape(p.shape))
            offset += p.size
        middle = self.recorder.now()
        self.recorder.span(self.worker, self.step, "allreduce", start, middle, sent)
        # round two: every Q = Mᵀ·P̂
        qs = compressor.middle(p_means)
        second, sent_q = self._mean(np.concatenate([q.reshape(-1) for q in qs]) if qs else np.zeros(0))
        q_means, offset = [], 0
        for q in qs:
            q_means.append(second[offset:offset + q.size].reshape(q.shape))
            offset += q.size
        self.recorder.span(self.worker, self.step, "allreduce", middle, self.recorder.now(), sent_q)
        self.bytes_sent += sent + sent_q
        self._applied(compressor.finish(plain_mean, q_means))

    def sparse_allgather(self, action: SparseAllGather) -> None:
        compressor = self.compressors[action]
        begun = self.recorder.now()
        indices, values = compressor.compress(self._flat_grad())
        index = torch.from_numpy(indices.astype(np.int32)).to(self.device)  # INDEX_BYTES each
        value = torch.from_numpy(values).to(self.device, self.wire_dtype)
        start = self.recorder.now()
        self.recorder.span(self.worker, self.step, "compute", begun, start)
        every_index, every_value = self._gather(index), self._gather(value)
        sent = index.numel() * index.element_size() + value.numel() * value.element_size()
        self.bytes_sent += sent
        self.recorder.span(self.worker, self.step, "allgather", start, self.recorder.now(), sent)
        applied = scatter_mean([i.cpu().numpy().astype(np.int64) for i in every_index],
                               [v.double().cpu().numpy() for v in every_value], compressor.size)
        self._applied(applied)

    def outer_step(self, action: OuterStep) -> None:
        start = self.recorder.now()
        numel = sum(p.numel() for p in self.model.parameters())
        bounds = [fragment_bounds(numel, action.count)[f] for f in action.fragments]
        flat = flat_params(self.model)
        # the fragments' pseudo-gradients in one all-reduce, rounded to the wire and summed there; divided by
        # W after, in fp32 (as averaging)
        pseudo = torch.cat([self.outer[(lo, hi)][0].detach() - flat[lo:hi].to(self.device) for lo, hi in bounds])
        pseudo = pseudo.to(self.wire_dtype)
        with self.heartbeat.waiting_for_peers():
            dist.all_reduce(pseudo, group=self.group)
        nbytes = pseudo.numel() * pseudo.element_size()
        mean = pseudo.float().div_(self.cfg.world)
        offset = 0
        for lo, hi in bounds:  # each fragment's outer SGD steps its own copy with its own momentum
            anchor, outer = self.outer[(lo, hi)]
            anchor.grad = mean[offset:offset + hi - lo]
            outer.step()
            self._load_slice(lo, anchor.detach())
            offset += hi - lo
        self.bytes_sent += nbytes
        end = self.recorder.now()
        self.recorder.span(self.worker, self.step, "outer", start, end, nbytes)
        self._fold_local_steps(end)
