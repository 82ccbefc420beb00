"""Rollout publishers: ``rewardstream publish`` and the collector's Kafka hook (coming next)."""
