"""rewardstream: a streaming reward profiler for LLM RL rollouts, compatible with NeMo Gym 0.7.0.

A folder per layer, from the top: ``commands``; ``processors``, ``producers``, ``sinks`` and
``gym_servers`` (the top-level folders, reached here through symlinks); ``kafka`` and ``infra``
(plumbing); ``contract`` (every wire notion); ``errors`` (ARCHITECTURE.md, "Layers and folders").
"""

__version__ = "0.1.0"
