"""`sweepctl init NAME [--dir DIR]`: a directory to start from with your own training code: a train loop package, a
TrainingSweep that runs it, a Dockerfile, a README."""

from __future__ import annotations

import argparse
import keyword
import re
import shlex
import sys
from pathlib import Path

from sweep_contracts import constants

from . import init_templates as templates
from .code_path import module_location
from .common import EXIT_OK, UsageError

DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Trials the scaffolded sweep runs at once: both of its 2 one-CPU trials on a 2-core machine.
MAX_CONCURRENT_TRIALS = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "init",
        help="start a project for your own train loop: package, sweep.yaml, Dockerfile, README",
        description="Write NAME/ (or --dir DIR): a Python package with train_loop(config) written as Ray Train's "
        "docs teach it, sweep.yaml (a TrainingSweep running it on 2 CPUs), a Dockerfile that adds the package to "
        "the training image, and a README with the next commands.",
    )
    p.add_argument("name", metavar="NAME", help="the sweep's name (a DNS-1123 label: lowercase letters, digits, '-')")
    p.add_argument("--dir", metavar="DIR", help="the directory to write (default: ./NAME); must be new or empty")
    p.set_defaults(func=run)


def check_name(name: str) -> str:
    if not DNS_1123_LABEL.fullmatch(name):
        raise UsageError(
            f"NAME {name!r}: not a DNS-1123 label (at most 63 lowercase letters, digits or '-', starting and ending "
            "with a letter or digit); it names the TrainingSweep"
        )
    return name


def package_name(name: str) -> str:
    """The loop's Python package: NAME with '_' for '-', suffixed `_loop` where that would not be importable as
    itself (a leading digit, a keyword) or would shadow a module Python already finds (`json`, `ray`, `torch`)."""
    package = name.replace("-", "_")
    if not package.isidentifier() or keyword.iskeyword(package):
        return f"loop_{package}"
    if package in sys.stdlib_module_names or module_location(package) is not None:
        return f"{package}_loop"
    return package


def target_dir(name: str, value: str | None) -> Path:
    """The directory to write: new, or an empty directory; UsageError naming the argument it came from."""
    option = "--dir" if value is not None else "NAME"
    target = Path(value if value is not None else name).expanduser()
    if target.exists() and not target.is_dir():
        raise UsageError(f"{option} {target}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        raise UsageError(f"{option} {target}: exists and is not empty; choose another NAME or --dir")
    return target


def scaffold(name: str, target: Path, package: str) -> list[Path]:
    """Write the project into `target`, the loop in `package`; the files written, in the order they are listed."""
    shown = str(target)
    values = {
        "name": name,
        "package": package,
        "dir": shown,
        "api_version": constants.API_VERSION,
        "ray_version": constants.SUPPORTED_RAY_VERSION,
        "train_image": templates.TRAIN_IMAGE,
        "image_version": templates.IMAGE_VERSION,
        "max_concurrent": str(MAX_CONCURRENT_TRIALS),
    }
    files = {
        Path(package, "__init__.py"): templates.render(templates.PACKAGE_INIT, **values),
        Path(package, "loop.py"): templates.LOOP,
        Path("sweep.yaml"): templates.render(templates.SWEEP, **values),
        Path("Dockerfile"): templates.render(templates.DOCKERFILE, **values),
        Path(".dockerignore"): templates.render(templates.DOCKERIGNORE, **values),
        Path("README.md"): templates.render(templates.README, **values),
    }
    written = []
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def run(args: argparse.Namespace) -> int:
    name = check_name(args.name)
    target = target_dir(name, args.dir)
    package = package_name(name)
    written = scaffold(name, target, package)
    shown = shlex.quote(str(target))
    print(f"sweepctl init: created {target}/ (spec.trainLoop: {package}.loop:train_loop)")
    for path in written:
        print(f"  {path}")
    print(
        "\nNext:\n"
        f"  sweepctl validate -f {shown}/sweep.yaml\n"
        f"  sweepctl run-local -f {shown}/sweep.yaml --storage /tmp/{name}-runs\n"
        f"  docker build -t {name}:{templates.IMAGE_VERSION} {shown}\n"
        f"The loop's contract (config, reports, checkpoints): docs/your-training-loop.md; more in {shown}/README.md"
    )
    return EXIT_OK
