"""NeMo Gym's collection commands: ``ng_collect_rollouts`` (``collect``, ``materialize``),
``ng_aggregate_rollouts``, ``ng_e2e_collect_rollouts`` and ``rewardstream demo``."""
