"""The numerics of gradient compressors, one worker's side, in numpy: defined once, used by every executor.

A compressor is one worker's state (its error-feedback residual, PowerSGD's
warm-started Q) and the stages between its collectives. The replay
(syncsim.convergence.replay) runs one compressor per worker and takes the means
itself; the real executor (real/) runs one per rank and all-reduces or
all-gathers between the stages. Both therefore compute the same arithmetic in
the same order. ``send`` rounds what crosses the wire to the scheme's precision
(syncsim.convergence.wire.Wire.send; the identity at fp32).
"""

from syncsim.compression.powersgd import LowRank, Segment, layout, orthonormalise
from syncsim.compression.topk import Sparsifier, scatter_mean, select

__all__ = ["LowRank", "Segment", "layout", "orthonormalise", "Sparsifier", "select", "scatter_mean"]
