"""NeMo-Gym-compatible servers: a model server (proxy or simulated policy), the arithmetic
resources server, a simple agent, and ``ng_run`` to start them from NeMo Gym-shaped YAML."""
