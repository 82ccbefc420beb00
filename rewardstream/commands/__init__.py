"""The console scripts: ``rewardstream`` and ``ng_reward_profile`` (``cli``), ``gym``
(``gym_cli``), ``rewardstream publish`` (``publish``) and ``rewardstream watch`` (``watch``).
They wire the layers below; nothing imports them but other commands."""
