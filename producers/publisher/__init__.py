"""The Kafka publisher: ``rewardstream publish`` (``publish``, its forked ``lines`` encoders),
the collector's Kafka sink (``live``) and a collection's default run id (``run_id``)."""
