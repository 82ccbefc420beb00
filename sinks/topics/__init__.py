"""The processors' output topics: ``profiles`` writes the finals and profiles (the leader, in
one transaction) and reads them back; beside it the readers the producers use: ``pages``
(the members topic: the live page's URL), ``content`` (is a final the profile of these files)
and ``wait`` (``--wait-profile``)."""
