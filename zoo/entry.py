"""The `zoo` executable: the no-op fast path first, then the full CLI.

Kept tiny on purpose: nothing here imports the CLI framework unless it is needed.
"""

from __future__ import annotations

import sys


def main() -> None:
    from zoo.fastpath import try_noop

    code = try_noop(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from zoo.cli import main as cli_main

    cli_main()
