"""``python -m autotune.sim vllm|sglang ...``: run a simulated engine process."""

import sys

from autotune.sim.app import main

sys.exit(main())
