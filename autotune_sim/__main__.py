"""``python -m autotune_sim vllm|sglang ...``: run a simulated engine process."""

import sys

from autotune_sim.app import main

sys.exit(main())
