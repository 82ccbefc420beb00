"""rewardstream: a streaming reward profiler for LLM RL rollouts, compatible with NeMo Gym 0.7.0.

The command-line edges live here (``cli``, ``batch``, ``jsonl``, ``overrides``, ``kafka_local``);
the pure profile core is the ``processors`` package and the file writers are ``sinks``.
"""

__version__ = "0.1.0"
