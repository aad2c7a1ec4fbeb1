"""`python -m gpuready` is the same program as `gpuready`."""

from gpuready.cli.app import main

raise SystemExit(main())
