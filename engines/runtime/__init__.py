"""Engine processes and their supervision: spawn, readiness and liveness, output,
start phases, warm starts, the traffic relayed to each engine, and one adapter per engine."""
