"""Workload's own check (no pydantic) against the pydantic model built from the same rules: the same values and
fields given, or the same refusal, for plain values and for those only pydantic takes (a number as a string)."""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from gpuready.workload import Workload, make_workload
from gpuready.workload.spec import FIELDS, _plain, _pydantic_model

VALUES: dict[str, list[Any]] = {
    "model": ["gpt2", "", 5, None],
    "task": ["train", "infer", "Train", 1],
    "method": ["full", "lora", "qlora", "LoRA"],
    "batch": [1, 8, 1_000_000, 0, 1_000_001, "8", " 8", 8.0, 8.5, True, "x"],
    "seq": [1, 4096, 0, "2048"],
    "grad_ckpt": [True, False, "true", 1, "maybe"],
    "lora_targets": ["q_proj, v_proj", "", [], ["a"], ["a", 3], ("a",), None],
    "as_family": ["llama", "nope", None, 3],
    "shard": ["none", "ddp", "fsdp", "zero9"],
    "gpus": [1, 2, 4096, 4097, "2"],
}


def _both(fields: dict[str, Any]) -> tuple[Any, Any]:
    try:
        checked = _pydantic_model()(**fields)
        expected: Any = ({n: getattr(checked, n) for n in FIELDS}, checked.model_fields_set)
    except ValidationError as exc:
        expected = ("refused", str(exc))
    try:
        w = Workload(**fields)
        got: Any = (w.model_dump(), w.model_fields_set)
    except ValidationError as exc:
        got = ("refused", str(exc))
    return got, expected


@pytest.mark.parametrize("name", list(VALUES))
def test_each_value_alone_gives_what_the_pydantic_model_gives(name: str) -> None:
    for value in VALUES[name]:
        fields = {"model": "gpt2", name: value}
        got, expected = _both(fields)
        assert got == expected, fields


def test_values_together_give_what_the_pydantic_model_gives() -> None:
    names = ("task", "method", "shard", "gpus", "batch")
    for combo in itertools.product(*(VALUES[n][:4] for n in names)):
        fields = {"model": "llama-3.2-1b", **dict(zip(names, combo, strict=True))}
        got, expected = _both(fields)
        assert got == expected, fields


def test_unknown_or_missing_fields_are_refused_as_pydantic_refuses_them() -> None:
    for fields in ({"model": "gpt2", "bogus": 1}, {}, {"batch": 2}):
        got, expected = _both(fields)
        assert got[0] == "refused" and got == expected, fields


def test_only_plain_values_skip_pydantic() -> None:
    assert _plain({"model": "gpt2", "batch": 8, "lora_targets": "q_proj,v_proj"}) is not None
    for odd in ({"batch": "8"}, {"batch": True}, {"batch": 8.0}, {"grad_ckpt": 1}, {"task": "Train"}):
        assert _plain({"model": "gpt2", **odd}) is None, odd


def test_copies_compare_hash_and_pickle_by_value() -> None:
    w = make_workload(model="gpt2", batch=2)
    same = Workload(model="gpt2", batch=2)
    assert w == same and hash(w) == hash(same) and {w: 1}[same] == 1
    copy = w.model_copy(update={"seq": 512})
    assert copy.seq == 512 and w.seq == 2048 and copy.model_fields_set == {"model", "batch", "seq"}
    assert copy != w and copy == make_workload(model="gpt2", batch=2, seq=512)
    back = pickle.loads(pickle.dumps(copy))
    assert back == copy and back.model_fields_set == copy.model_fields_set
    with pytest.raises(AttributeError):
        w.batch = 3  # type: ignore[misc]
    assert make_workload(model="gpt2", lora_targets="a,b").model_dump(mode="json")["lora_targets"] == ["a", "b"]


def test_a_plain_workload_and_its_estimate_import_no_pydantic() -> None:
    code = (
        "import sys; from gpuready.workload import make_workload; from gpuready.memory import estimate; "
        "estimate(make_workload(model='gpt2', batch=2, seq=128, method='lora'), 24 * 2**30); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
