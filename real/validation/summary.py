"""The study's summary: its figures as lines of text, then the verdict on its targets and the errors by
scheme and link rate."""

from __future__ import annotations

import pandas as pd

from real.validation.config import KEY
from real.validation.frame import baseline_repeats, recorded
from real.validation.measurement import SPREAD_WINDOWS
from real.validation.prediction import PREDICTION_SEEDS
from real.validation.verdict import abs_stats, error_table, failed, loss_table, verdict_lines

__all__ = ["summary_lines"]


def summary_lines(frame: pd.DataFrame, steadiness=None, default_keys: set | None = None,
                  wall_seconds: float | None = None, not_judged: str | None = None) -> list[str]:
    """The study's figures: step time, speedup and staleness errors, and the three worst configurations;
    with ``steadiness`` (real.testbed.steadiness.Steadiness, timed at the study's start), how steady the
    machine's own speed was: the floor under every row's error that no model removes. Then the verdict on
    the targets (real.validation.verdict), which ``steadiness``, ``default_keys`` (the full default grid's
    configurations) and ``wall_seconds`` (the grid's wall time) decide whether the run can give (or
    ``not_judged`` withholds, saying why), and the errors by scheme and link rate."""
    ok = frame[~failed(frame)]
    lines = _error_lines(ok) + _drift_lines(ok, steadiness) + _diagnostic_lines(ok) + _worst_lines(ok)
    if failed(frame).any():
        lines.append(f"{int(failed(frame).sum())} configurations failed (their rows say why)")
    lines += verdict_lines(frame, steadiness, default_keys, KEY, wall_seconds, not_judged)
    table = error_table(frame)
    if table:
        lines += ["step time |error| by scheme and link rate (median / max (rows)):"] + table
    table = loss_table(frame)
    if table:
        lines += ["loss curves, |replayed / logged loss - 1| by scheme (median of the rows' medians / max of their "
                  "maxima):"] + table
    return lines


def _error_lines(ok: pd.DataFrame) -> list[str]:
    """Step time, speedup and staleness errors of the rows that did not fail."""
    from syncsim.units import parse_bandwidth

    lines = []
    med, top, n = abs_stats(ok["rel_error"])
    if not n:  # every row failed before it was measured: no figure to give, and none printed as "nan%"
        return ["step time: no configuration was both predicted and measured"]
    lines.append(f"step time: median |error| {med:.1%}, max {top:.1%} over {n} configurations")
    # how many meet the targets' bounds, and where the misses are: by link rate, slowest first
    errors = ok["rel_error"].abs()
    by_link = sorted((parse_bandwidth(rate), rate, float(e.median())) for rate, e in errors.groupby(ok["bandwidth"]))
    lines.append(f"step time: {int((errors <= 0.10).sum())} configurations within 10%, "
                 f"{int((errors <= 0.15).sum())} within 15%; median |error| by link "
                 + ", ".join(f"{rate} {median:.1%}" for _, rate, median in by_link))
    med, top, n = abs_stats(ok["speedup_error"])
    if n:
        lines.append(f"speedup: median |error| {med:.1%}, max {top:.1%} over {n} configurations "
                     "(the one-worker baselines, the denominator, left out)")
    med, top, n = abs_stats(ok["staleness_mean_error"])
    if n:
        distance = ok.loc[ok["staleness_mean_error"].notna(), "staleness_distance"].median()
        within = int((ok["staleness_mean_error"].abs() <= 0.20).sum())
        lines.append(f"staleness mean: median |error| {med:.1%}, max {top:.1%} over {n} asynchronous or SSP "
                     f"configurations ({within} within 20%); median KS distance between the distributions "
                     f"{distance:.2f}")
    return lines


def _drift_lines(ok: pd.DataFrame, steadiness) -> list[str]:
    """How far this machine's own speed moved: within each run, between the baseline's repeats, over the
    steadiness windows timed at the study's start; and the packets the testbed's shapers dropped."""
    lines = []
    spread = recorded(ok, "measured_spread")
    if len(spread):
        lines.append(f"measured step time wandered within its own run by a median {spread.median():.1%}, max "
                     f"{spread.max():.1%} (coefficient of variation over {SPREAD_WINDOWS} windows): the floor "
                     "below which a row's error is this machine's drift, not the model's")
    for repeats in baseline_repeats(ok):
        measured, probed = repeats.measured, repeats.probed
        lines.append(f"repeatability: {repeats.model}'s one-worker baseline, run {repeats.runs} times, measured "
                     f"{measured.low * 1e3:.2f}-{measured.high * 1e3:.2f} ms ({measured.apart:.0%} apart), "
                     f"its compute probes {probed.low * 1e3:.2f}-{probed.high * 1e3:.2f} ms "
                     f"({probed.apart:.0%} apart): one configuration measured again on this machine")
    if steadiness is not None:
        lines.append(f"machine steadiness: {steadiness.line()}")
    dropped = recorded(ok, "dropped")
    if len(dropped):  # a lost packet costs TCP a retransmission, up to a 200 ms timeout: not in the model
        lossy = dropped[dropped > 0]
        lines.append(f"the testbed's shapers dropped no packet in any of {len(dropped)} runs" if lossy.empty else
                     f"the testbed's shapers dropped packets in {len(lossy)} of {len(dropped)} runs "
                     f"(at most {int(lossy.max())} in one): steps there include TCP's recoveries")
    return lines


def _diagnostic_lines(ok: pd.DataFrame) -> list[str]:
    """The replay with each run's own compute, the loss curves, and how much the model varies by seed."""
    lines = []
    replayed = recorded(ok, "replayed_error")
    if len(replayed):
        med, top, n = abs_stats(replayed)
        lines.append(f"replayed (each run's own compute phases in the simulator, a diagnostic, not a prediction): "
                     f"median |error| {med:.1%}, max {top:.1%} over {n} configurations: what the model "
                     "misses besides compute")
    compared = recorded(ok, "loss_rel_max")
    if len(compared):  # the run's own losses against its schedule replayed (losses.loss_figures)
        steps = int(ok.loc[compared.index, "loss_steps"].max())
        lines.append(f"loss curves: each run's logged per-step losses against its update log replayed on its model "
                     f"and data (real.replay), up to its first {steps} steps: |relative difference| median "
                     f"{ok.loc[compared.index, 'loss_rel_median'].median():.2g} (of the rows' medians), max "
                     f"{compared.max():.2g} over {len(compared)} configurations; by scheme below")
    seeds = recorded(ok, "predicted_seed_cv")
    if len(seeds):
        lines.append(f"predicted step time varied from seed to seed by a median {seeds.median():.1%}, max "
                     f"{seeds.max():.1%} ({PREDICTION_SEEDS} simulations pooled per configuration)")
    return lines


def _worst_lines(ok: pd.DataFrame) -> list[str]:
    """The three configurations whose step time was predicted worst."""
    worst = ok.reindex(ok["rel_error"].abs().sort_values(ascending=False).index).head(3)
    return [f"  worst: {r['scheme']} on {r['world']} workers, {r['bandwidth']}, {r['model']}"
            + (f", slow {r['slow']:g}" if r["slow"] > 1 else "")
            + f": predicted {r['predicted_step_time'] * 1e3:.1f} ms, measured "
              f"{r['measured_step_time'] * 1e3:.1f} ms ({r['rel_error']:+.1%})"
            for _, r in worst.iterrows()]
