import pytest

from gpuready.errors import InputError
from gpuready.storage.projection import job_sizes, lora_trainable_params, project_disk
from gpuready.workload import make_workload

GIB = 1024**3


def test_lora_adapter_size_matches_peft_count_for_llama_8b() -> None:
    # PEFT's print_trainable_parameters for Llama-3-8B, r=16, all linear layers of the blocks: 41,943,040
    w = make_workload(model="llama-3.1-8b", method="lora")
    assert lora_trainable_params(w) == 41_943_040
    qv = make_workload(model="llama-3.1-8b", method="lora", lora_targets="q_proj,v_proj")
    assert lora_trainable_params(qv) == 32 * 16 * ((4096 + 4096) + (4096 + 1024))


def test_checkpoint_sizes_follow_precision_and_optimizer() -> None:
    full = job_sizes(make_workload(model="llama-3.1-8b"))
    assert full.model_bytes == full.trainable_params * 2
    assert full.checkpoint_bytes == full.trainable_params * (2 + 8)
    mixed = job_sizes(make_workload(model="llama-3.1-8b", precision="mixed", optim="adamw8bit"))
    assert mixed.checkpoint_bytes == mixed.trainable_params * (4 + 2)
    infer = job_sizes(make_workload(model="llama-3.1-8b", task="infer"))
    assert infer.checkpoint_bytes == 0


def test_projection_says_fits_warns_and_does_not_fit() -> None:
    ok = project_disk(free_bytes=100 * GIB, total_bytes=200 * GIB, model_bytes=10 * GIB, checkpoint_bytes=GIB)
    assert ok.fits and not ok.warn and ok.need_bytes == 12 * GIB and ok.headroom_bytes == 88 * GIB
    tight = project_disk(free_bytes=100 * GIB, total_bytes=200 * GIB, model_bytes=85 * GIB)
    assert tight.fits and tight.warn  # 15 GiB left is under 10 % of 200 GiB
    no = project_disk(free_bytes=20 * GIB, model_bytes=16 * GIB, checkpoint_bytes=5 * GIB, keep_checkpoints=3)
    assert no.fits is False and no.items["checkpoints"] == 15 * GIB
    unknown = project_disk(free_bytes=None, model_bytes=GIB)
    assert unknown.fits is None and unknown.message == "free space unknown"
    with pytest.raises(InputError):
        project_disk(free_bytes=1, keep_checkpoints=-1)
