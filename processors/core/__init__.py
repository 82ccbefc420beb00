"""The pure core: per-task and per-agent statistics and the three profile files.

No I/O, no framework: ``state`` (the mergeable store), ``records`` (a result row read by the
rules), ``kernels``, ``welford``, ``metric_names``, ``passk``, ``difficulty`` and ``profile``
(the outputs); beside them ``compare``, two runs' aggregate metrics compared.
"""
