"""Process exit codes: a public contract (systemd's RestartPreventExitStatus, ECS, scripts)."""

OK = 0
INTERNAL = 70  # a bug, or a crash loop an outer supervisor should see (EX_SOFTWARE)
USAGE = 64  # a command line the command cannot run (EX_USAGE), e.g. an invalid shard definition
UNAVAILABLE = 69  # a command needs an optional part that is not installed (EX_UNAVAILABLE)
NOT_FOUND = 66  # `drain`/`release` named a worker or shard the table does not have (EX_NOINPUT)
EXISTS = 73  # `shards add` of a shard the table already has (EX_CANTCREAT)
# `init-table --protocol 2` refused the flip: a live worker does not advertise the feature p2
# (EX_PROTOCOL); nothing is wrong, the fleet is not ready: upgrade it, then run it again.
FLEET_NOT_READY = 76
STORE_UNAVAILABLE = 75  # the lease store was unreachable at start-up (EX_TEMPFAIL): retry later
CONFIG = 78  # the configuration is invalid (EX_CONFIG): restarting will not help
