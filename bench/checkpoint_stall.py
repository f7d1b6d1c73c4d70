"""Benchmark: how long a checkpoint blocks the training loop, synchronous upload against asynchronous, against the time
to write the same state to local disk (the bound).

    .venv/bin/python bench/checkpoint_stall.py [--layers 4 --width 5120 --bandwidth-mb 100 --checkpoints 6
                                                --interval-s 8]

One Ray Train V2 run per mode (TorchTrainer, one CPU worker, on one local Ray): a model of `layers` x
nn.Linear(width, width) (4 x 5120 -> 105M parameters, 420 MB) trains for `interval-s` between checkpoints, then
reports through `report_epoch(upload=mode)`. The stall of a checkpoint is the time `report_epoch` took in the
training loop; the bound is the time its write of the checkpoint's files to local disk took, inside that same call
(timed around the helper that writes them), so both see the same page cache. The Train run dir is on a filesystem
that passes every write through one token bucket of `bandwidth-mb` MB/s (a pyarrow PyFileSystem over a local
directory), so the upload time, and the ratio, do not depend on how fast a local S3 server is. Prints one JSON
object: per mode, each checkpoint's stall, local write and the uploads still waiting when it began; their medians
over all checkpoints but the first (Train's first report also starts its synchronisation actor) and their ratio.
The goal: the asynchronous stall at most 1.5 x the local write.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GOAL_RATIO = 1.5


class _TokenBucket:
    """Writes of all streams of one filesystem share `rate` bytes per second."""

    def __init__(self, rate: float):
        self.rate = rate
        self.lock = threading.Lock()
        self.next_free = time.monotonic()

    def take(self, size: int) -> None:
        with self.lock:
            start = max(self.next_free, time.monotonic())
            self.next_free = start + size / self.rate
            wait = self.next_free - time.monotonic()
        if wait > 0:
            time.sleep(wait)


class _ThrottledWriter:
    def __init__(self, path: str, bucket: _TokenBucket):
        self._file = open(path, "wb")  # noqa: SIM115 - closed by pyarrow through close()
        self._bucket = bucket
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._bucket.take(view.nbytes)
        return self._file.write(view)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        self.closed = True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class ThrottledLocalFS(pafs.FileSystemHandler):
    """A local filesystem whose writes go at most `rate` bytes per second (shared by every stream); reads are free."""

    def __init__(self, rate: float):
        self.rate = rate
        self._fs = pafs.LocalFileSystem()
        self._bucket = _TokenBucket(rate)

    def __getstate__(self) -> dict[str, Any]:
        return {"rate": self.rate}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.rate = state["rate"]
        self._fs = pafs.LocalFileSystem()
        self._bucket = _TokenBucket(self.rate)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ThrottledLocalFS) and other.rate == self.rate

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "throttled-local"

    def normalize_path(self, path: str) -> str:
        return self._fs.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to empty the root directory")

    def delete_file(self, path: str) -> None:
        self._fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self._fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self._fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self._fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return pa.PythonFile(_ThrottledWriter(path, self._bucket), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        raise OSError("append is not supported")


def train_loop(config: dict[str, Any]) -> None:
    """Runs in the Train worker: `checkpoints` x (train for `interval_s`, time the report and its local write)."""
    import torch

    from training_entrypoints import async_upload, checkpointing

    torch.manual_seed(0)
    layers = [torch.nn.Linear(config["width"], config["width"]) for _ in range(config["layers"])]
    model = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    rows = []
    writes: list[float] = []
    write_files = checkpointing._write_state_files

    def timed_write(*args: Any, **kwargs: Any) -> None:
        # The bound: the same files written to the same local disk, in the same call, so page-cache state (which moves
        # a 420 MB write between 0.2 and 1.5 s here) is the same for both.
        started = time.monotonic()
        write_files(*args, **kwargs)
        writes.append(time.monotonic() - started)

    checkpointing._write_state_files = timed_write  # type: ignore[assignment]  # timed in this worker only
    for epoch in range(config["checkpoints"]):
        ends = time.monotonic() + config["interval_s"]
        steps = 0
        while time.monotonic() < ends or steps == 0:
            loss = model(torch.randn(8, config["width"])).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
        waiting = async_upload.uploads_in_flight()
        writes.clear()
        started = time.monotonic()
        checkpointing.report_epoch(
            {"loss": loss.item(), "epoch": epoch}, epoch=epoch, model=model, optimizer=optimizer, upload=config["mode"]
        )
        stall = time.monotonic() - started
        rows.append({"epoch": epoch, "steps": steps, "stall_s": round(stall, 3), "local_write_s": round(writes[0], 3),
                     "uploads_waiting_before": waiting})  # fmt: skip
    Path(config["out"]).write_text(json.dumps(rows))


def run_mode(mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = work / f"{mode}.json"
    started = time.monotonic()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "mode": mode,
            "layers": args.layers,
            "width": args.width,
            "checkpoints": args.checkpoints,
            "interval_s": args.interval_s,
            "out": str(out),
        },
        scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
        run_config=RunConfig(
            name=f"stall-{mode}",
            storage_path=str(work / "store"),
            storage_filesystem=pafs.PyFileSystem(ThrottledLocalFS(args.bandwidth_mb * 1e6)),
        ),
    )
    trainer.fit()
    rows = json.loads(out.read_text())
    steady = rows[1:] or rows
    stall = statistics.median(r["stall_s"] for r in steady)
    bound = statistics.median(r["local_write_s"] for r in steady)
    return {
        "checkpoints": rows,
        "median_stall_s": round(stall, 3),
        "median_local_write_s": round(bound, 3),
        "stall_over_local_write": round(stall / bound, 2),
        "run_s": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=5120)
    parser.add_argument("--bandwidth-mb", type=float, default=100.0, help="upload bandwidth, MB/s (1e6 bytes)")
    parser.add_argument("--checkpoints", type=int, default=6)
    parser.add_argument("--interval-s", type=float, default=8.0, help="training time between checkpoints")
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    args = parser.parse_args(argv)

    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="checkpoint-stall-"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        results = {mode: run_mode(mode, args, work) for mode in args.modes}
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    params = args.layers * (args.width * args.width + args.width)
    document: dict[str, Any] = {
        "parameters": params,
        "bandwidth_mb_s": args.bandwidth_mb,
        "interval_s": args.interval_s,
        "max_pending_uploads": int(os.environ.get("SWEEP_MAX_PENDING_UPLOADS") or 2),
        "cpus": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "modes": results,
    }
    if "async" in results:
        document["goal_ratio"] = GOAL_RATIO
        document["goal_met"] = results["async"]["stall_over_local_write"] <= GOAL_RATIO
    print(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
