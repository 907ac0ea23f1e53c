"""Secrets never reach logs, the journal, the screen or snapshots: mask passwords in URLs."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_URL_IN_TEXT = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://)([^/\s:@]*):([^@\s/]*)@")


def mask_url(url: str) -> str:
    """``redis://:secret@host:6379/0`` -> ``redis://:***@host:6379/0``; URLs without a password are unchanged.
    Also handles ``;``-separated failover lists as Celery accepts them."""
    if ";" in url:
        return ";".join(mask_url(part) for part in url.split(";"))
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask_text(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def mask_text(text: str) -> str:
    """Mask every ``scheme://user:password@`` found inside free text (error messages, log lines)."""
    return _URL_IN_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", text)
