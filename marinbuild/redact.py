"""Keep secret environment values out of logs, plans and records.

A variable is secret when its name contains TOKEN, KEY, SECRET or PASSWORD (any case).

>>> redact_env({"HF_TOKEN": "hf_abc", "SEED": "1"})
{'HF_TOKEN': '***', 'SEED': '1'}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["REDACTED", "is_secret_name", "redact_env", "scrub", "secret_values"]

REDACTED = "***"
_SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
# Shorter values would blank out ordinary words and digits in every log line.
_MIN_SCRUB_LEN = 4


def is_secret_name(name: str) -> bool:
    """Whether a variable called ``name`` holds a secret.

    >>> is_secret_name("wandb_api_key"), is_secret_name("SEED")
    (True, False)
    """
    upper = name.upper()
    return any(marker in upper for marker in _SECRET_MARKERS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with every secret value replaced by ``***``.

    >>> redact_env({"DB_PASSWORD": "hunter2"})
    {'DB_PASSWORD': '***'}
    """
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values of ``env``'s secret variables that are long enough to scrub, longest first."""
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_SCRUB_LEN}
    return tuple(sorted(values, key=len, reverse=True))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret value replaced by ``***``.

    >>> scrub("token=hf_abcdef ok", ["hf_abcdef"])
    'token=*** ok'
    """
    for value in secrets:
        if value:
            text = text.replace(value, REDACTED)
    return text
