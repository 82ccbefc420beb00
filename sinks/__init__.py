"""Where profiles go: NeMo Gym's files (``files``), Prometheus (``metrics``), the snapshot
wire form (``snapshot_wire``), ``rewardstream curate``, and the finals, profiles and members
topics (``topics``)."""
