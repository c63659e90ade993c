"""The one place where API keys are removed from text before it is stored, printed or logged.

`redact(text)` removes the value of every key the chat client has read (it registers each one here,
in this process only, never on disk), any `sk-`-like token, and any `Bearer <token>`. A body cut
short by a read limit can end in the first characters of a key, or quote only its last characters
(as some APIs do: `sk-proj-****1234`): every word of 4 or more characters that is a piece of a known
key and looks like key material (a digit, a capital, or 12+ characters) is removed too, and so is a
trailing fragment that is the start of a key.

Apply it BEFORE cutting text to a length (`clip` does both in the right order): a key cut in two no
longer matches its full value.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

from regroup.errors import ConfigError

MASK = "***"
MIN_FRAGMENT = 4  # a key piece this long or longer is a leak

_BEARER = re.compile(r"(?i)\b(Bearer)\s+[^\s\"',;]+")
# sk-<8+ key characters> not glued to a word before it ("task-based" and "risk-free" stay intact).
_SK_TOKEN = re.compile(r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_\-]{8,}")
_WORD = re.compile(rf"[A-Za-z0-9_\-]{{{MIN_FRAGMENT},}}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_known: set[str] = set()
_known_lock = threading.Lock()


def remember_secret(value: str | None) -> None:
    """Add a key's value to the ones `redact` always removes (kept in memory, in this process only)."""
    if value and len(value) >= MIN_FRAGMENT:
        with _known_lock:
            _known.add(value)


def _secrets(extra: Iterable[str | None]) -> list[str]:
    with _known_lock:
        found = set(_known)
    found.update(s for s in extra if s and len(s) >= MIN_FRAGMENT)
    return sorted(found, key=len, reverse=True)  # longest first: a key inside another is not half-replaced


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` without any known key (or one in `secrets`), `sk-` token, `Bearer` token or key fragment."""
    if not text:
        return text
    keys = _secrets(secrets)
    for key in keys:
        text = text.replace(key, MASK)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _SK_TOKEN.sub(MASK, text)
    if keys:
        text = _WORD.sub(lambda m: MASK if _is_key_piece(m.group(0), keys) else m.group(0), text)
        text = _strip_key_prefix(text, keys)
    return text


def _is_key_piece(word: str, keys: list[str]) -> bool:
    """A word that is a piece of a key and looks like key material: a digit, a capital or 12+ characters.
    (A plain lowercase word such as "rewrite" stays, even when a test key happens to contain it.)"""
    shaped = len(word) >= 12 or any(c.isdigit() or c.isupper() for c in word)
    return shaped and any(word in key for key in keys)


def _strip_key_prefix(text: str, keys: list[str]) -> str:
    """`text` without a trailing fragment that is the first 4+ characters of a key (a cut-off key)."""
    for key in keys:
        for n in range(min(len(key) - 1, len(text)), MIN_FRAGMENT - 1, -1):
            if text.endswith(key[:n]):
                return text[:-n] + MASK
    return text


def clip(text: str, limit: int, secrets: Iterable[str | None] = ()) -> str:
    """`text` redacted, then cut to `limit` characters (in that order, so a cut cannot split a key)."""
    text = redact(text, secrets)
    return text if len(text) <= limit else text[:limit]


def looks_like_a_key(name: str) -> bool:
    """True when `name` (meant to NAME an environment variable) looks like a key's value instead:
    an `sk-` prefix, a `Bearer` prefix, characters no variable name has, or long mixed-case-and-digit."""
    if name.startswith(("sk-", "sk_")) or name.lower().startswith("bearer"):
        return True
    if not _ENV_NAME.fullmatch(name):
        return True
    mixed = any(c.islower() for c in name) and any(c.isupper() for c in name) and any(c.isdigit() for c in name)
    return len(name) >= 20 and mixed


KEY_FIX = "the value is not shown; a key is one line of printable ASCII: check the .env file or the export"
"""Said after `key_value_problem`'s words."""


def key_value_problem(value: str) -> str | None:
    """What keeps an API key's value out of an `Authorization` header, in words that never quote it (a line break,
    a non-ASCII character, a space or a control character); None when it can be sent. The key is sent as read: a
    line break from a Windows .env file is not stripped, as the OpenAI and httpx clients do not strip it."""
    if "\r" in value or "\n" in value:
        return "has a line break"
    if not value.isascii():
        return "has a non-ASCII character"
    if any(not "!" <= c <= "~" for c in value):
        return "has a space or a control character"
    return None


def check_key_env_name(name: str | None, field: str) -> None:
    """Refuse an `api_key_env` value that looks like a key, without ever printing it.

    None or "" (no authentication: a local server started without --api-key) passes. Raises
    `regroup.errors.ConfigError` naming only `field`.
    """
    if name is None or name == "":
        return
    if not isinstance(name, str):
        raise ConfigError(f"{field}: must name an environment variable (e.g. OPENAI_API_KEY)")
    if looks_like_a_key(name):
        raise ConfigError(
            f"{field}: this looks like an API key, not the NAME of an environment variable (value not shown); "
            f"put the key in a variable (export OPENAI_API_KEY=...) and set {field}=OPENAI_API_KEY"
        )
