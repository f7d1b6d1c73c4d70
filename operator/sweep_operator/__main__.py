"""`python -m sweep_operator`: run the operator (kopf)."""

from __future__ import annotations

import sys


def main() -> int:
    from .handlers import run_operator  # the only kopf-aware module

    return run_operator(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
