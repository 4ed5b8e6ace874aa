"""Fuzz campaigns over pytest-xdist workers and a shared Hypothesis example database.

- :func:`example_database`: ``--example-db`` as a Hypothesis database: a directory
  (``DirectoryBasedExampleDatabase``, safe to share between processes on one machine) or a Redis
  server (``RedisExampleDatabase``) that workers on several machines share, so a failure found by
  one is replayed first by the others and by the next run.
- :func:`configure_worker`: a worker ``gwI`` takes CUDA device ``I mod count`` (of the devices
  ``CUDA_VISIBLE_DEVICES`` leaves visible) and notes its examples and tallies in files the
  controller reads.
- :func:`collect_node`: the controller merges each worker's tallies into the summary table
  (from the worker's output, or from its last saved tally if it died) and reports the example a
  dead worker was running as a failure of that property, with the command that replays it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from flashprop.properties.report import autosave, merge_rows, note_current, record

#: The folder, shared by the controller and its workers, where each worker keeps its files.
_FOLDER = "flashprop_campaign_dir"


def example_database(spec: str):
    """The Hypothesis example database named by ``--example-db``."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as err:
            raise ValueError(f"--example-db {spec}: Redis needs the redis package ({err})") from err
        return RedisExampleDatabase(redis.Redis.from_url(spec), key_prefix=b"flashprop:")
    return DirectoryBasedExampleDatabase(spec)


def configure_node(node) -> None:
    """Controller side: a folder for the worker's files (one per controller, made once)."""
    folder = getattr(configure_node, "folder", None)
    if folder is None:
        folder = configure_node.folder = tempfile.mkdtemp(prefix="flashprop-workers-")
    node.workerinput[_FOLDER] = folder


def _files(folder: str, worker: str) -> tuple[Path, Path]:
    return Path(folder) / f"{worker}.tally.json", Path(folder) / f"{worker}.current.json"


def configure_worker(workerinput: dict, device: str) -> None:
    """Worker side: its CUDA device, and where it saves its tally and notes its current example."""
    worker = workerinput.get("workerid", "gw0")
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(int(worker.removeprefix("gw") or 0) % torch.cuda.device_count())
    folder = workerinput.get(_FOLDER)
    if folder:
        tally, current = _files(folder, worker)
        autosave(str(tally))
        note_current(str(current))


def collect_node(node, error) -> None:
    """Controller side: merge the worker's tallies; a dead worker's last example is a failure."""
    worker = node.workerinput.get("workerid", "?")
    folder = node.workerinput.get(_FOLDER)
    found = getattr(node, "workeroutput", {}).get("flashprop_tallies")
    tally, current = _files(folder, worker) if folder else (None, None)
    if found is None and tally is not None and tally.exists():
        found = json.loads(tally.read_text())
    merge_rows(found or [])
    if error is not None and current is not None and current.exists():
        last = json.loads(current.read_text())
        message = "\n".join([
            f"property {last['property']!r} failed for kernel {last['kernel']!r}",
            f"problem: {last['problem']}",
            f"the worker {worker} running it died ({str(error).strip().splitlines()[-1] if error else ''});"
            " xdist replaced it and the campaign went on",
            "replay this property on this problem alone:",
            "    " + last["replay"],
        ])
        record(last["kernel"], last["property"], "failed", 0.0, message)
    for path in (tally, current):
        if path is not None and path.exists():
            os.unlink(path)
