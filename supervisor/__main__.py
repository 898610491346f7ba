"""``python -m supervisor`` is the ``shardvisor`` command."""

import sys

from supervisor.cli import main

sys.exit(main())
