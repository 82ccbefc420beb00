"""What produces rollouts and sends them: NeMo Gym's collection commands (``gym``), the Kafka
publisher and the collector's sink (``publisher``), and ``events``, a collection's lines as
wire events, which both share with the in-process transport."""
