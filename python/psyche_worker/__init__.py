"""psyche's PyTorch worker: model, training, DisTrO, served over ZeroMQ to the TypeScript client."""

import os as _os

# Recorded before the slow imports (torch) so a parent that dies during start-up is still noticed.
STARTUP_PARENT_PID = _os.getppid()
