"""The one sweep runner every study uses: cached, resumable, parallel here or on a Dask cluster.

A study is a function of one configuration (a frozen dataclass) returning a
result (a dict of numbers and strings, or of pandas DataFrames), and a list of
configurations. ``run`` gives back the results in the configurations' order:

- each result is cached under ``OUT/cache/`` by a hash of the study's name,
  the configuration's fields and the code version (syncsim's version and a
  hash of the ``syncsim`` and ``studies`` sources), written atomically the
  moment it is done — so an interrupted study resumes where it stopped and a
  rerun with nothing changed computes nothing;
- the rest run in parallel processes on this machine (``jobs``), or on a
  running Dask cluster when ``scheduler`` is its address (``tcp://HOST:8786``;
  Dask's own scheduler and workers, not a home-made one), with a progress bar
  either way.

Starting a Dask cluster: ``dask scheduler`` on one host, ``dask worker
tcp://HOST:8786`` on each of the others (every worker needs this project
installed, e.g. ``pip install -e .`` on a shared file system), or, on Slurm,
``dask_jobqueue.SLURMCluster(...).scale(jobs=N)`` and its
``scheduler_address``. Then ``python -m studies.scaling --scheduler
tcp://HOST:8786``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from syncsim.files import write_atomic

__all__ = ["run", "config_key", "code_version", "default_jobs"]

_PACKAGES = ("syncsim", "studies")


@lru_cache(maxsize=1)
def code_version() -> str:
    """syncsim's version and a hash of the study and simulator sources: a code change is a new version."""
    import syncsim

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return f"{syncsim.__version__}+{digest.hexdigest()[:12]}"


def _plain(value: Any) -> Any:
    """A configuration's field as JSON: dataclasses by their fields, tuples as lists, floats exact."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, float):
        return repr(value)  # exact and JSON-safe for inf and nan
    return value


def config_key(study: str, config: Any, function: Callable[[Any], Any] | None = None) -> str:
    """The cache key of one configuration: a hash of the study, the function, its fields and the code version."""
    name = None if function is None else f"{function.__module__}.{function.__qualname__}"
    text = json.dumps({"study": study, "function": name, "config": _plain(config), "code": code_version()},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# -- results on disk: DataFrames as column lists, everything else as JSON ------------------------
def _encode(value: Any) -> Any:
    if isinstance(value, pd.DataFrame):
        return {"__frame__": value.to_dict(orient="list"), "__columns__": list(value.columns)}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__frame__" in value:
        return pd.DataFrame(value["__frame__"], columns=value["__columns__"])
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value


def _load(path: Path) -> Any | None:
    try:
        return _decode(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None  # missing, or a file a crash left unreadable: compute it again


def _save(path: Path, result: Any) -> None:
    write_atomic(path, json.dumps(_encode(result)))


def _pending(study: str, function: Callable[[Any], Any], configs: Sequence[Any],
             cache: Path | None) -> tuple[list[str], dict[int, Any]]:
    keys = [config_key(study, c, function) for c in configs]
    done: dict[int, Any] = {}
    if cache is not None:
        for i, key in enumerate(keys):
            result = _load(cache / f"{key}.json")
            if result is not None:
                done[i] = result
    return keys, done


def run(function: Callable[[Any], Any], configs: Sequence[Any], *, study: str, out: Path | None,
        jobs: int = 1, scheduler: str | None = None, desc: str | None = None) -> list[Any]:
    """``function(config)`` for every configuration, cached under ``out/cache`` (no cache when ``out`` is None)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    configs = list(configs)
    cache = None if out is None else Path(out) / "cache"
    keys, done = _pending(study, function, configs, cache)
    todo = [i for i in range(len(configs)) if i not in done]
    bar = tqdm(total=len(configs), initial=len(done), desc=desc or study, unit="run", dynamic_ncols=True,
               disable=None)

    def finish(i: int, result: Any) -> None:
        done[i] = result
        if cache is not None:
            _save(cache / f"{keys[i]}.json", result)
        bar.update()

    try:
        if scheduler:
            _on_dask(function, configs, todo, scheduler, finish)
        elif jobs == 1 or len(todo) <= 1:
            for i in todo:
                finish(i, function(configs[i]))
        else:
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
                futures = {pool.submit(function, configs[i]): i for i in todo}
                for future in as_completed(futures):
                    finish(futures[future], future.result())
    finally:
        bar.close()
    return [done[i] for i in range(len(configs))]


def _on_dask(function: Callable[[Any], Any], configs: list[Any], todo: list[int], scheduler: str,
             finish: Callable[[int, Any], None]) -> None:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise ValueError("--scheduler needs Dask's distributed package: pip install 'distributed>=2024.1'") from None
    try:
        client = Client(scheduler, timeout="20s")
    except (OSError, TimeoutError) as err:
        raise ValueError(f"no Dask scheduler answers at {scheduler!r} ({err}); start one with "
                         f"`dask scheduler` and workers with `dask worker {scheduler}`") from None
    with client:
        futures = client.map(function, [configs[i] for i in todo], pure=False)
        index = {future.key: i for future, i in zip(futures, todo)}
        for future in dask_completed(futures):
            finish(index[future.key], future.result())


def default_jobs() -> int:
    """Worker processes by default: every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
