"""The validation as a library: a configuration predicted by syncsim and measured on the emulated network.

``python -m studies.validation`` is the study built on it (its grid, command line, progress and figure);
these modules are what it, and anyone comparing a prediction with a testbed run, call:

- config: Config, one configuration (scheme, workers, link rate, model, slowed worker); KEY, its columns
- traffic: what a configuration's run sends, and what its link probe times (timed_size, timed_gather)
- settings: Settings, what every configuration of one study shares (folder, steps, batch, probe repeats)
- calibration: calibrate, the Cluster and Workload of a configuration from this machine's probes
- prediction: predict (simulations pooled over seeds), run_steps, replay (the run's own compute simulated)
- measurement: measure, the configuration run for real on a testbed
- losses: a run's logged losses against its schedule replayed (loss_figures)
- evaluation: evaluate, one row: calibrated, predicted, measured, compared
- frame: COLUMNS, derive (errors, speedups), baseline_repeats
- summary: summary_lines; verdict: the targets, met or missed, or why a run cannot judge them

Nothing here imports studies/: the arrows run from the study to the library.
"""
