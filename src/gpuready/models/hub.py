"""Configs of hub models that are not presets: fetched once with huggingface_hub, then read from its cache."""

from __future__ import annotations

import json
from typing import Any

from gpuready.errors import InputError, ModelNotFoundError


def fetch_config(repo_id: str) -> dict[str, Any]:
    try:
        from huggingface_hub import hf_hub_download
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
    try:
        path = hf_hub_download(repo_id, "config.json")
    except GatedRepoError:
        raise ModelNotFoundError(
            repo_id, "gated on the hub; log in with `hf auth login` or pass a config.json"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(repo_id, "no such repository on the hub") from None
    except EntryNotFoundError:
        raise ModelNotFoundError(repo_id, "the repository has no config.json") from None
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            repo_id, "not a preset and the hub cannot be reached (offline); pass a local config.json"
        ) from None
    except Exception as exc:  # network stacks raise many types; all mean "could not fetch"
        raise ModelNotFoundError(repo_id, f"could not fetch config.json ({type(exc).__name__})") from None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError("MODEL", f"{repo_id}: cached config.json unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise InputError("MODEL", f"{repo_id}: config.json is not a JSON object")
    return data
