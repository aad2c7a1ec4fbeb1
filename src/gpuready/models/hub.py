"""Configs of hub models that are not presets: the local Hugging Face cache first, else one quick fetch.

Offline is found out in about a second, not after huggingface_hub's retries (five, up to 8 s apart): one TCP
connection to the hub's endpoint with a short timeout decides whether a download is tried at all, and
HF_HUB_OFFLINE=1 skips it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gpuready.errors import InputError, ModelNotFoundError

CONNECT_TIMEOUT_S = 1.5


def _offline_env() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the endpoint opens within `timeout` (name lookup included), else why not."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or type(exc).__name__)

    worker = threading.Thread(target=attempt, daemon=True)  # name lookups ignore socket timeouts
    worker.start()
    worker.join(timeout + 0.2)
    if not outcome:
        return f"no answer from {host} within {timeout:g} s"
    return outcome[0]


def fetch_config(repo_id: str, *, reachable: Callable[[str], str | None] = hub_reachable) -> dict[str, Any]:
    try:
        from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise ModelNotFoundError(
            repo_id, "not a preset; fetching hub configs needs huggingface_hub (pip install 'gpuready[hub]')"
        ) from None
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return _read(repo_id, cached)
    if _offline_env() or constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(
            repo_id, "not a preset, not in the local Hugging Face cache, and HF_HUB_OFFLINE is set; pass a config.json"
        )
    why = reachable(constants.ENDPOINT)
    if why is not None:
        raise ModelNotFoundError(
            repo_id,
            f"not a preset and the hub cannot be reached ({constants.ENDPOINT}: {why}); "
            "pass a local config.json or model folder",
        )
    try:
        path = hf_hub_download(repo_id, "config.json", etag_timeout=CONNECT_TIMEOUT_S * 4)
    except GatedRepoError:
        raise ModelNotFoundError(
            repo_id, "gated on the hub; log in with `hf auth login` or pass a config.json"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(repo_id, "no such repository on the hub (or it is private)") from None
    except EntryNotFoundError:
        raise ModelNotFoundError(repo_id, "the repository has no config.json") from None
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            repo_id, "not a preset and the hub cannot be reached (offline); pass a local config.json"
        ) from None
    except Exception as exc:  # network stacks raise many types; all mean "could not fetch"
        raise ModelNotFoundError(repo_id, f"could not fetch config.json ({type(exc).__name__})") from None
    return _read(repo_id, path)


def _read(repo_id: str, path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError("MODEL", f"{repo_id}: cached config.json unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise InputError("MODEL", f"{repo_id}: config.json is not a JSON object")
    # multimodal configs nest the language model (as models/local.py reads them)
    if "text_config" in data and "hidden_size" not in data and isinstance(data["text_config"], dict):
        inner = dict(data["text_config"])
        inner.setdefault("model_type", data.get("model_type"))
        return inner
    return data
