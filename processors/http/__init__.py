"""The stream processor's HTTP face: ``server`` (the endpoints), ``page`` (the live page and
its ``static/`` files), ``auth`` (bearer token, login) and ``snapshot`` (forked builders)."""
