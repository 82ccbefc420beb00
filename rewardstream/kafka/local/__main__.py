"""``python -m rewardstream.kafka.local kafka ...``: the ``kafka`` command without the rest of
``rewardstream``, for tests and scripts."""

import sys

from rewardstream.kafka.local.cli import main

sys.exit(main())
