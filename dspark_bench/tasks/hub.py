"""Is the Hugging Face hub reachable? Asked once, quickly, before a hub download."""

from __future__ import annotations

import socket
from urllib.parse import urlparse


def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick connection to the hub, instead of datasets' retries with back-off (~25 s)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True  # offline mode: let datasets look in its local cache
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True
