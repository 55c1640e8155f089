"""Statistical efficiency: replay a simulated update order on a real optimisation problem.

``simulate`` says *when* each gradient lands and *which parameter version* it
was computed on; ``replay`` re-enacts exactly that on a problem from
``syncsim.convergence.problems`` and returns loss (and accuracy) against
simulated wall-clock time, from which ``time_to_target`` reads time-to-accuracy.
"""

from syncsim.convergence.digits import Digits
from syncsim.convergence.log import UpdateLog
from syncsim.convergence.optimizer import SGD, AdamW, Nesterov
from syncsim.convergence.problems import LogisticRegression, Problem, Quadratic
from syncsim.convergence.replay import Replayer, replay
from syncsim.convergence.sampler import Sampler
from syncsim.convergence.scaler import LossScaler, LossScaling
from syncsim.convergence.stability import delay_bound
from syncsim.convergence.target import steps_to_target, time_to_target
from syncsim.convergence.wire import Wire

__all__ = [
    "Problem", "Quadratic", "UpdateLog", "LogisticRegression", "Digits", "replay", "Replayer", "Sampler", "SGD",
    "AdamW", "Nesterov", "LossScaling", "LossScaler", "Wire", "time_to_target", "steps_to_target", "delay_bound",
]
