"""Engine dialects of the simulator: each speaks one real engine's flags, logs, routes and metrics."""
