"""The work a compressor does on one worker at each stage of its action: FLOPs and values passed over."""

from __future__ import annotations

from syncsim.schemes import LowRankAllReduce, OuterStep, SparseAllGather

__all__ = ["compression_work"]


def compression_work(action: object, workers: int) -> tuple[tuple[float, float], ...]:
    """(FLOPs, values passed over) of one worker's own work at each stage of ``action``, ``workers``
    workers: before its first collective, between its collectives, after its last. Empty for an
    action without such work. Counted from the numerics every executor runs (syncsim.compression);
    elementwise passes over O(k) or O(rank·(rows + cols)) values beside O(n) ones are left out, and so
    is dividing a sum by W, the all-reduce's own arithmetic, which no collective is charged for
    (syncsim.collectives).

    - ``LowRankAllReduce`` (syncsim.compression.powersgd, as torch's powerSGD_hook): before round one
      Δ = g + e (n values) and the uncompressed values copied into round one's buffer (u), then
      P = ΔQ (2·rows·cols·r FLOPs a matrix); between the rounds Gram–Schmidt of P, two passes (4·rows·r²) and
      Q = ΔᵀP̂ (2·rows·cols·r); after round two P̂Qᵀ (2·rows·cols·r), the uncompressed mean copied back
      (u) and e = Δ − applied (n). The FLOPs add up to ``LowRankAllReduce.flops``.
    - ``SparseAllGather`` (syncsim.compression.topk): before the all-gather Δ = g + e, |Δ|, the
      partition that finds the k-th magnitude, and the two comparisons that pick the entries above
      and at it (5 passes over n), and the k sent entries read and subtracted from the residual (2k);
      after it the scatter-add of every worker's entries into a zeroed dense gradient and its division
      by W (``scatter_mean``: n + W·k + n).
    - ``OuterStep`` (DiLoCo, over the fragment's f values): before its all-reduce the pseudo-gradient
      (last outer value − value now: f); after it torch.optim.SGD's Nesterov step as torch writes it
      (torch/optim/sgd.py, _single_tensor_sgd: buf.mul_(μ).add_(Δ), Δ.add(buf, alpha=μ),
      param.add_(·, alpha=−lr): 4 passes; with momentum 0 only the last) and the result copied into
      the replica (f): 5·f, or 2·f without momentum.
    """
    if isinstance(action, LowRankAllReduce):
        u = action.uncompressed
        n = u + sum(rows * cols for rows, cols in action.matrices)
        product = float(sum(2 * rows * cols * r for r, (rows, cols) in zip(action.ranks(), action.matrices)))
        gram_schmidt = float(sum(4 * rows * r * r for r, (rows, _) in zip(action.ranks(), action.matrices)))
        return (product, float(n + u)), (gram_schmidt + product, 0.0), (product, float(u + n))
    if isinstance(action, SparseAllGather):
        n, k = action.size, action.values
        return (0.0, float(5 * n + 2 * k)), (0.0, float(2 * n + workers * k))
    if isinstance(action, OuterStep):
        f = action.values
        return (0.0, float(f)), (0.0, float((5 if action.momentum else 2) * f))
    return ()
