"""Every wire notion: the producers' events (``events``), what processors tell each other
(``engine``), and what a run id, a stem and a topic prefix may be (``names``)."""
