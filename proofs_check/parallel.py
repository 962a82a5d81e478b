"""Running many (claim, precision) searches: recorded searches replayed, the rest on a process pool.

:func:`run_pairs` is what :func:`proofs_check.runner.run` calls. Each search is independent, so
they run on ``jobs`` worker processes (forked, so the registry is not imported again), slowest
first by the last run's timings, and come back in catalogue order. Each search first tries to
replay its recording (:mod:`proofs_check.replay`); without one, or when the replay does not
reproduce every recorded pass and failure, hypothesis searches again and the new search is
recorded. The verdicts are those of a plain serial run.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Optional

from . import registry, replay
from .claim import ERROR, PENDING, Pending, Result
from .search import run_claim, violation_message


def _search(
    claim_id: str,
    precision: str,
    examples: int,
    deterministic: bool,
    shrink: bool,
    cache: bool,
    seed=None,
) -> Result:
    claim = registry.get(claim_id)
    start = time.perf_counter()
    settings = (examples, deterministic, shrink)
    use_cache = cache and deterministic and seed is None  # the record keeps the default search
    if use_cache:
        calls = replay.load(claim_id, precision, settings)
        if calls is not None:
            try:
                implementation = claim.implementation()
                result = replay.replay(claim, precision, calls, implementation, violation_message)
            except Pending:
                result = None
            except Exception:  # the check now raises: let the search report it
                result = None
            if result is not None:
                result.seconds = time.perf_counter() - start
                result.extra["replayed"] = True
                return result
    record = [] if use_cache else None
    result = run_claim(
        claim,
        precision,
        examples=examples,
        deterministic=deterministic,
        shrink=shrink,
        record=record,
        seed=seed,
    )
    if use_cache and result.verdict not in (ERROR, PENDING):
        replay.save(claim_id, precision, settings, record)
    result.seconds = time.perf_counter() - start
    return result


def _portable(result: Result) -> tuple:
    """A Result without its Claim (claims hold lambdas, which do not pickle)."""
    return (
        result.claim.id,
        result.precision,
        result.tried,
        result.worst,
        result.verdict,
        result.counterexample,
        result.message,
        result.seconds,
        result.extra,
    )


def _worker(args) -> tuple:
    return _portable(_search(*args))


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)  # one search per core


def _timings_path():
    folder = replay.cache_dir()
    return None if folder is None else folder / "timings.json"


def _load_timings() -> dict:
    path = _timings_path()
    try:
        return json.loads(path.read_text()) if path is not None and path.exists() else {}
    except (OSError, ValueError):
        return {}


def _save_timings(results: list) -> None:
    path = _timings_path()
    if path is None:
        return
    timings = _load_timings()
    timings.update({f"{r.claim.id} {r.precision}": round(r.seconds, 3) for r in results})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(timings, indent=0, sort_keys=True))
    except OSError:
        pass


def run_pairs(
    pairs: list,
    *,
    examples: int,
    deterministic: bool,
    shrink: bool,
    jobs: int = 1,
    cache: bool = True,
    progress: Optional[Callable[[Result], None]] = None,
    seed=None,
) -> list:
    """One Result per ``(claim, precision)`` of ``pairs``, in that order."""
    tasks = [(c.id, p, examples, deterministic, shrink, cache, seed) for c, p in pairs]
    results: list = [None] * len(tasks)
    if jobs <= 1 or len(tasks) <= 1:
        for i, task in enumerate(tasks):
            results[i] = _search(*task)
            if progress is not None:
                progress(results[i])
    else:
        timings = _load_timings()
        order = sorted(
            range(len(tasks)), key=lambda i: -timings.get(f"{tasks[i][0]} {tasks[i][1]}", 1.0)
        )
        with ProcessPoolExecutor(
            max_workers=jobs,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_init_worker,
        ) as pool:
            futures = {pool.submit(_worker, tasks[i]): i for i in order}
            for fut in as_completed(futures):
                i = futures[fut]
                cid, prec, tried, worst, verdict, cex, msg, secs, extra = fut.result()
                results[i] = Result(pairs[i][0], prec, tried, worst, verdict, cex, msg, secs, extra)
                if progress is not None:
                    progress(results[i])
    if cache and deterministic and seed is None:
        _save_timings(results)
    return results
