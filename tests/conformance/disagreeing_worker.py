"""`hookbus worker` as a worker that disagrees with the spec's constants, for the kit to
catch: it leaves a drain after 1.25 s (the TypeScript worker's old settle, not the spec's
1.75 s), ignores the reply size limits the kit gives it, and ignores the version it is
given (so a version the rule refuses never stops it).

    python -m tests.conformance.disagreeing_worker worker --group conformance ... Probe
"""

from __future__ import annotations

import os
import sys

from hookbus.services.cli.main import main
from hookbus.services.worker import drain

if __name__ == "__main__":
    drain.PIN_SETTLE = 1.25
    os.environ.pop("HOOKBUS_WORKER_VERSION", None)
    os.environ["HOOKBUS_MAX_HOP_BYTES"] = os.environ["HOOKBUS_MAX_STATE_BYTES"] = str(1 << 30)
    main(sys.argv[1:])
