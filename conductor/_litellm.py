"""Import litellm configured for offline, quiet use. Import litellm through this module.

litellm fetches its model price map from the network when imported unless
``LITELLM_LOCAL_MODEL_COST_MAP`` is set; we always use the copy shipped in the wheel, so the
product works offline and start-up never waits on a network timeout.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

# litellm prints a "Give Feedback / Get Help" banner on errors, and may log request bodies at
# debug level: neither belongs on a user's terminal or in Prefect logs.
litellm.suppress_debug_info = True
litellm.drop_params = True
litellm.telemetry = False

__all__ = ["litellm"]
