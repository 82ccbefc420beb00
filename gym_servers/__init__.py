"""NeMo-Gym-compatible model, resources and agent servers and ``ng_run`` (coming next)."""
