"""Recorded H200 allocator histories replayed through the allocator model (docs/calibration/histories)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuready.memory.history import compare_program, history_streams, load_history, replay_capped, replay_history
from gpuready.memory.program import Program
from gpuready.units import KIB, MIB

HISTORIES = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "histories"

# small ones, one per kind: a full fine-tune whose reserve depends on segment placement, DDP's rank 0, FSDP2's
# rank 0 (three CUDA streams), LoRA, generation
CASES = [
    "ft_qwen15_bf16.json.gz",
    "ddp_llama1b.json.rank0.gz",
    "fsdp_llama8b.json.rank0.gz",
    "lora_gemma2_2b.json.gz",
    "gen_llama1b_fp16.json.gz",
]


@pytest.mark.parametrize("name", CASES)
def test_model_reproduces_the_gpu_reserve_on_the_recorded_requests(name: str) -> None:
    doc = load_history(HISTORIES / name)
    at_gpu_addresses = replay_history(doc, "gpu")
    assert at_gpu_addresses.model_peak_reserved_bytes == at_gpu_addresses.gpu_peak_reserved_bytes
    assert at_gpu_addresses.first_difference is None
    as_modelled = replay_history(doc, "model")
    assert abs(as_modelled.error) < 0.0025


def test_segment_placement_decides_ties_that_move_the_reserve() -> None:
    # always-rising addresses (gpuready before this test) miss this job's reserve by 3.8%; the model's placement
    # (large segments falling) and the GPU's own addresses do not
    doc = load_history(HISTORIES / "ft_qwen15_bf16.json.gz")
    rising = replay_history(doc, "rising")
    assert rising.error < -0.03
    assert rising.first_difference is not None
    assert "modeling_qwen2" in rising.first_difference.gpu_frames
    assert replay_history(doc, "model").error == 0


def test_live_at_peak_names_the_frames(tmp_path: Path) -> None:
    doc = {
        "events": [
            ["segment_alloc", 4096, 20 * 2**20, 0, 0],
            ["alloc", 4096, 3 * 2**20, 0, 1],
            ["alloc", 4096 + 3 * 2**20, 2 * 2**20, 0, 2],
            ["free_requested", 4096, 0, 0, 1],
            ["free_completed", 4096, 0, 0, 1],
        ],
        "frames": ["", "forward@a.py:1", "forward@b.py:2"],
        "reset_at": 0,
        "peak_reserved_bytes": 20 * 2**20,
        "peak_allocated_bytes": 5 * 2**20,
    }
    path = tmp_path / "h.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    res = replay_history(load_history(path), "gpu")
    assert res.model_peak_reserved_bytes == 20 * 2**20
    assert res.trace_peak_allocated_bytes == 5 * 2**20
    assert dict(res.live_at_peak) == {"forward@a.py:1": 3 * 2**20, "forward@b.py:2": 2 * 2**20}
    with pytest.raises(ValueError, match="placement"):
        replay_history(doc, "sideways")


def _capped_doc(events: list[list[object]], cap: int) -> dict[str, object]:
    return {"events": events, "frames": ["", "forward@a.py:1", "loss@b.py:2"], "reset_at": 0, "memory_cap_bytes": cap}


def test_capped_replay_fails_where_the_gpu_failed_when_the_cache_is_split() -> None:
    mib = 2**20
    # a freed 40 MiB block takes a 5 MiB request (the only cached block), so its segment is split and its 35 MiB
    # free cannot be released: a 40 MiB request under a 70 MiB cap finds no room, as on the GPU (its `oom` event)
    events: list[list[object]] = [
        ["alloc", 0, 40 * mib, 0, 1],
        ["alloc", 1 << 30, 10 * mib, 0, 1],
        ["free_completed", 0, 40 * mib, 0, 1],
        ["alloc", 0, 5 * mib, 0, 1],
        ["oom", 0, 40 * mib, 0, 2],
    ]
    res = replay_capped(_capped_doc(events, 70 * mib))
    assert res.gpu_oom_event == 4 and res.gpu_oom_bytes == 40 * mib
    assert res.model_failed_at is None
    assert res.model_fails_there is True
    assert res.model_reserved_bytes == 50 * mib
    assert res.model_free_split_bytes == 35 * mib and res.model_free_whole_bytes == 0
    assert res.gpu_frames == "loss@b.py:2"


def test_capped_replay_says_when_the_model_places_what_the_gpu_could_not() -> None:
    mib = 2**20
    # the 10 MiB block was freed: its segment is whole again, released under the cap, and the request fits
    events: list[list[object]] = [
        ["alloc", 0, 10 * mib, 0, 1],
        ["free_completed", 0, 10 * mib, 0, 1],
        ["oom", 0, 65 * mib, 0, 2],
    ]
    res = replay_capped(_capped_doc(events, 70 * mib))
    assert res.model_fails_there is False
    assert res.model_releases == 1


def test_capped_replay_needs_a_cap() -> None:
    with pytest.raises(ValueError, match="cap"):
        replay_capped({"events": [], "frames": [], "reset_at": 0})


# FSDP2 histories (rank 0) and their jobs: the estimator's program must make the same segments as the recorded
# requests, stream by stream (compute, all-gather, reduce-scatter), when both go through the allocator model
FSDP_JOBS = [
    ("fsdp_qwen3b_b2.json.rank0.gz", "qwen2.5-3b --batch 2 --seq 2048 --precision bf16 --gpus 2 --shard fsdp"),
    ("fsdp_llama1b.json.rank0.gz", "llama-3.2-1b --batch 4 --seq 2048 --precision bf16 --gpus 2 --shard fsdp"),
]


@pytest.mark.parametrize(("name", "job"), FSDP_JOBS)
def test_fsdp2_program_makes_the_recorded_segments_on_every_stream(name: str, job: str) -> None:
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    w = workload_from_args(job)
    streams = compare_program(load_history(HISTORIES / name), train_program(resolve_model(w.model), w))
    assert [c.stream for c in streams] == [0, 1, 2]
    for c in streams:
        # before the residual stream was replayed tensor by tensor, qwen2.5-3b's compute stream made one fp32-logits
        # segment (2374 MiB) too few: 35820 MiB against the history's 38212 (-6.3%)
        assert c.first_difference is None, c.stream
        large = {size: n for size, n in c.history_segments.items() if size > 2 * 2**20}
        assert {size: n for size, n in c.program_segments.items() if size > 2 * 2**20} == large
        assert c.program_reserved_bytes == pytest.approx(c.history_reserved_bytes, rel=0.001)


def test_compare_program_names_the_first_large_segment_made_differently() -> None:
    mib = 2**20
    doc = {
        "events": [
            ["alloc", 1, 30 * mib, 0, 1],
            ["free_completed", 1, 30 * mib, 0, 1],
            ["alloc", 2, 12 * mib, 7, 2],  # a side stream (FSDP2's all-gather)
            ["alloc", 3, 40 * mib, 0, 3],  # the cached 30 MiB block is too small: a new segment
        ],
        "frames": ["", "forward@a.py:1 < outer@b.py:2", "allocate@c.py:3", "forward@d.py:4"],
    }
    prog = Program(streams={"fsdp_all_gather_buffers": 1})
    prog.free(prog.alloc("activations", 30 * mib))
    prog.alloc("fsdp_all_gather_buffers", 12 * mib)
    prog.alloc("activations", 20 * mib)  # fits the cached block: no segment
    compute, gather = compare_program(doc, prog, context=1)
    assert (gather.stream, gather.history_stream, gather.first_difference) == (1, 7, None)
    assert gather.history_reserved_bytes == gather.program_reserved_bytes == 12 * mib
    assert compute.history_reserved_bytes == 70 * mib and compute.program_reserved_bytes == 30 * mib
    assert compute.first_difference is not None
    ours, theirs = compute.first_difference[1], compute.first_difference[0]
    assert (theirs.segment_bytes, theirs.label) == (40 * mib, "forward@d.py:4")
    assert ours.segment_bytes == 0  # the program made no second segment
    assert [e.label for e in compute.history_context] == ["forward@a.py:1", "forward@d.py:4"]


@pytest.mark.parametrize(
    "name",
    [
        "lora_qwen7b_s2048_b3_cap80.json.gz",  # failed on its 3.48 GiB fp32 logits after releasing 12 segments
        "lora_ckpt_qwen7b_s1024_b10_cap40.json.gz",  # ran after releasing 5 segments
        "lora_ckpt_qwen3b_s2048_b4_cap24.json.gz",  # ran after releasing 5 segments
        "lora_ckpt_qwen7b_s1024_b9_cap40.json.gz",  # ran, no release
        # session 11: vision transformers failing under the cap (max-batch sets 8 and 17's first failed batches)
        "h32_vitl16_bf16_b142_cap24.json.gz",  # on a 132 MiB bias-gradient reduction buffer, after 21 releases
        "h33_vitb16_bf16_b1360_cap80.json.gz",  # on a 1.53 GiB MLP tensor, with 2.7 GiB cached in split segments
    ],
)
def test_allocator_model_under_the_cap_does_what_the_gpu_did(name: str) -> None:
    # round 9 (2026-12-01): histories recorded under `trial --gpu-memory`; the model replays the GPU's requests
    # under the same cap, releasing its cache as PyTorch's malloc does, and ends with the GPU's reserve, or fails
    # on the request the GPU failed on
    res = replay_capped(load_history(HISTORIES / name))
    assert res.model_failed_at is None
    # exact where the job ran; at the failure the model holds 2 MiB (one small-pool segment) less than the GPU
    assert abs(res.model_reserved_bytes - res.gpu_reserved_bytes) <= 2 * MIB
    if res.gpu_oom_event is None:
        assert res.model_fails_there is None
    else:
        assert res.model_fails_there is True
        assert (
            res.gpu_oom_bytes
            == {
                "lora_qwen7b_s2048_b3_cap80.json.gz": 3_737_124_864,  # 3 x 2048 x 152064 fp32 logits, rounded to 2 MiB
                "h32_vitl16_bf16_b142_cap24.json.gz": 138_412_032,  # ops.reduce_buffer_bytes(1024, 142 x 197)
                "h33_vitb16_bf16_b1360_cap80.json.gz": 1_646_100_480,  # 1360 x 197 x 3072 bf16 (an MLP tensor)
            }[name]
        )


# round 10 (2026-12-01): the LoRA programs against the same capped histories
CAPPED_JOBS = [
    ("lora_qwen7b_s2048_b3_cap80.json.gz", "qwen2.5-7b --method lora --seq 2048 --batch 3"),
    ("lora_ckpt_qwen3b_s2048_b4_cap24.json.gz", "qwen2.5-3b --method lora --grad-ckpt --seq 2048 --batch 4"),
    ("lora_ckpt_qwen7b_s1024_b10_cap40.json.gz", "qwen2.5-7b --method lora --grad-ckpt --seq 1024 --batch 10"),
    # round 11: the histories recorded under the cap in round 10 (the GPU failed on the first two, ran the others)
    ("qwen3_8b_lora_ckpt_s2048_b5_cap40.json.gz", "qwen3-8b --method lora --grad-ckpt --seq 2048 --batch 5"),
    ("lora_qwen3b_s1024_b2_cap24.json.gz", "qwen2.5-3b --method lora --seq 1024 --batch 2"),
    ("lora_ckpt_qwen15b_s2048_b3_cap16.json.gz", "qwen2.5-1.5b --method lora --grad-ckpt --seq 2048 --batch 3"),
    ("full_llama3b_s2048_b2_cap40.json.gz", "llama-3.2-3b --seq 2048 --batch 2"),
    ("mixed_llama1b_s2048_b3_cap40.json.gz", "llama-3.2-1b --precision mixed --seq 2048 --batch 3"),
    # round 13: max-batch set 21's answer over what ran (10 predicted, 9 ran): bitsandbytes' 8-bit AdamW states and
    # the final norm's backward with its weight training; the GPU failed at 10 on the second step's logits, ran 9
    ("h41_adamw8bit_smollm2_b10_cap24.json.gz", "smollm2-1.7b --optim adamw8bit --grad-ckpt --seq 2048 --batch 10"),
    ("h41_adamw8bit_smollm2_b9_cap24.json.gz", "smollm2-1.7b --optim adamw8bit --grad-ckpt --seq 2048 --batch 9"),
]


@pytest.mark.parametrize(("name", "job"), CAPPED_JOBS)
def test_lora_program_under_the_recorded_cap_fails_or_runs_as_the_gpu_did(name: str, job: str) -> None:
    from gpuready.memory.allocator import replay
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / name)
    w = workload_from_args(job)
    stats = replay(train_program(resolve_model(w.model), w).events, doc["memory_cap_bytes"])
    gpu = replay_capped(doc)
    assert (stats.oom_event is not None) == (gpu.gpu_oom_event is not None)
    if gpu.gpu_oom_event is None:
        assert stats.peak_reserved_bytes == pytest.approx(gpu.gpu_reserved_bytes, rel=0.01)


RECORDED_ORDER = [
    *(CAPPED_JOBS[i] for i in (0, 1, 2, 3, 4, 5)),
    # two histories with no cap: no checkpointing at 2048 tokens, and checkpointing at 4096 (its rotary cos and sin
    # are 2 MiB large-pool blocks, kept by the checkpoint until the first layer's backward)
    ("lora_llama8b_b1.json.gz", "llama-3.1-8b --method lora --lora-r 16 --batch 1 --seq 2048"),
    ("lora_qwen3_8b_ckpt.json.gz", "qwen3-8b --method lora --lora-r 32 --grad-ckpt --batch 1 --seq 4096"),
]


# --autocast (the HF Trainer's bf16=True over bf16 weights), measured in held-out set 19: peft's fp32 adapters under
# autocast (with and without checkpointing, QLoRA), GPT-2's fp32 LayerNorms and gelu_new, a full fine-tune where
# autocast changes nothing. Before the switch was modelled these were +16%, +24% and -15% on the reserve
AUTOCAST_ORDER = [
    ("ac_llama1b_lora_b4.json.gz", "llama-3.2-1b --method lora --batch 4 --seq 2048 --autocast"),
    ("ac_qlora_llama8b_b1.json.gz", "llama-3.1-8b --method qlora --batch 1 --seq 2048 --autocast"),
    ("ac_lora_llama8b_ckpt_b4.json.gz", "llama-3.1-8b --method lora --grad-ckpt --batch 4 --seq 2048 --autocast"),
    ("ac_qwen3_06b_full_ckpt_b8.json.gz", "qwen3-0.6b --batch 8 --seq 2048 --grad-ckpt --autocast"),
    # GPT-NeoX's LayerNorms under autocast (held-out set 22: -7.3% allocated before they were modelled)
    ("ac_pythia1b_b8.json.gz", "pythia-1b --batch 8 --seq 1024 --autocast"),
    # TRL's QLoRA: adapters cast to bf16 (--lora-dtype bf16), with and without autocast, with checkpointing
    ("trl_qlora_llama8b_b1.json.gz", "llama-3.1-8b --method qlora --batch 1 --seq 2048 --autocast --lora-dtype bf16"),
    ("bf16lora_qlora_llama8b_b1.json.gz", "llama-3.1-8b --method qlora --batch 1 --seq 2048 --lora-dtype bf16"),
    (
        "trl_qlora_qwen3_4b_ckpt_b4.json.gz",
        "qwen3-4b --method qlora --grad-ckpt --batch 4 --seq 2048 --autocast --lora-dtype bf16",
    ),
    # prepare_model_for_kbit_training (--kbit-prep, lm/kbit_prep.py): without and with checkpointing, qwen2.5's biases
    ("kbit_prep_3.json.gz", "llama-3.1-8b --method qlora --batch 1 --seq 2048 --autocast --kbit-prep"),
    ("kbit_prep_1.json.gz", "llama-3.1-8b --method qlora --grad-ckpt --batch 1 --seq 2048 --autocast --kbit-prep"),
    ("kbit_prep_2.json.gz", "llama-3.1-8b --method qlora --grad-ckpt --batch 4 --seq 2048 --autocast --kbit-prep"),
    ("kbit_prep_4.json.gz", "qwen2.5-3b --method qlora --grad-ckpt --batch 4 --seq 2048 --autocast --kbit-prep"),
    # QLoRA's checkpointed first pass dequantizes every 4-bit weight (blocks_infer)
    ("qlora_qwen3_4b_ckpt_b8_s2048.json.gz", "qwen3-4b --method qlora --grad-ckpt --batch 8 --seq 2048"),
]


@pytest.mark.parametrize(("name", "job"), RECORDED_ORDER + AUTOCAST_ORDER)
def test_lora_program_makes_the_recorded_segments_in_the_recorded_order(name: str, job: str) -> None:
    # round 11 (memory/lm/lora_recorded.py): peft's LoRA backward, the checkpointed recompute's early stop, the final
    # norm, the residual stream. Before it the first large segment made differently was in the first checkpointed
    # layer (qwen3-8b: a 240 MiB segment where the history made a 160 MiB one) and the uncapped reserve was off by
    # -0.38%; after a release the program's cache held a whole logits-sized block the GPU's did not
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    w = workload_from_args(job)
    compute = compare_program(load_history(HISTORIES / name), train_program(resolve_model(w.model), w))[0]
    assert compute.first_difference is None
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.001)


def test_gpt2_under_autocast_keeps_its_fp32_norm_and_gelu_tensors() -> None:
    """GPT-2 under --autocast: the allocated peak (at the loss's backward) within 0.2% of the recorded history's,
    2 GiB above the same job without autocast (LayerNorm's and gelu_new's fp32 tensors, kept per block)."""
    from gpuready.memory import estimate
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "ac_gpt2_full_b8.json.gz")
    job = "gpt2 --batch 8 --seq 1024"
    on, off = estimate(workload_from_args(job + " --autocast")), estimate(workload_from_args(job))
    assert on.peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.002)
    assert on.peak_reserved_bytes == pytest.approx(doc["peak_reserved_bytes"], rel=0.002)
    assert on.peak_allocated_bytes - off.peak_allocated_bytes > 1.9 * 2**30


@pytest.mark.parametrize(("name", "job"), CAPPED_JOBS[:2])
def test_lora_program_loads_and_starts_the_forward_as_recorded(name: str, job: str) -> None:
    # peft moves every adapter to the GPU after the whole model is built, in the weights' dtype, then casts each to
    # fp32; the forward's cuBLAS workspace comes after the embedding output (rotary's matmul). With the adapters
    # among the weights and the workspace made first, the first large segment made differently was a 20 MiB one
    # for an adapter (qwen2.5-7b: history 26 MiB for a 24.5 MiB weight) and then the 32 MiB workspace
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    w = workload_from_args(job)
    compute = compare_program(load_history(HISTORIES / name), train_program(resolve_model(w.model), w))[0]
    if compute.first_difference is not None:
        theirs, ours = compute.first_difference
        assert "lora_adapters" not in ours.label and "cublas" not in ours.label
        assert "_device.py" not in theirs.label and "embedding" not in theirs.label  # past loading and embedding


def test_program_under_a_cap_fails_in_the_third_step_as_the_recorded_requests_do() -> None:
    # the probe runs three steps; llama-3.1-8b LoRA 1 x 2048's recorded requests under a 37.0 GiB cap fail on the
    # third step's fp32 logits (the cache after the second step's release holds no whole logits-sized block); the
    # program of two steps completed under that cap, promising a fit the GPU did not have
    from gpuready.memory.allocator import replay
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "lora_llama8b_b1.json.gz")
    w = workload_from_args("llama-3.1-8b --task train --method lora --lora-r 16 --batch 1 --seq 2048 --precision bf16")
    prog = train_program(resolve_model(w.model), w)
    for cap_gib in (37.0, 37.3):
        cap = int(cap_gib * 2**30)
        assert replay_capped(doc, cap).model_failed_at is not None
        assert replay(prog.events, cap).oom_event is not None, cap_gib
    # and where the recorded requests complete after releases, so does the program
    assert replay_capped(doc, int(38.3 * 2**30)).model_failed_at is None
    assert replay(prog.events, int(38.3 * 2**30)).oom_event is None


def test_full_fine_tuning_under_autocast_makes_each_weight_copy_with_its_linear() -> None:
    """phi-3-mini full fine-tuning, fp32 weights under autocast (held-out set 24, history h24_phi3_mixed): autocast's
    bf16 weight copies are made linear by linear and freed at each linear's backward. Made as one block per step
    they needed two 6.75 GiB segments of their own and the reserve came out +6.0% (allocated exact); now within
    1% of the recorded requests' reserve, the allocated peak unchanged, and no segment larger than the largest
    weight copy's."""
    from gpuready.memory import estimate
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "h24_phi3_mixed.json.gz")
    w = workload_from_args("phi-3-mini --batch 2 --seq 1024 --precision mixed")
    prog = train_program(resolve_model(w.model), w)
    compute = compare_program(doc, prog)[0]
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.011)
    assert max(compute.program_segments) <= 376 * MIB  # (the lm_head weight's and its gradients' size)
    copies = [h for h, c in enumerate(prog.categories) if c == "autocast_weight_copies"]
    assert len(copies) == 3 * (32 * 4 + 1)  # three steps, 32 layers' qkv/o/gate_up/down and lm_head
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.001)


@pytest.mark.parametrize(
    ("name", "job", "rel"),
    [
        ("h25_llama1b_mixed_b3.json.gz", "llama-3.2-1b --batch 3 --seq 2048 --precision mixed", 0.006),
        ("h25_gpt2m_mixed_b16.json.gz", "gpt2-medium --batch 16 --seq 1024 --precision mixed", 0.006),
        # Qwen3's q/k norms keep their 16-bit y (-3.8% allocated before); Gemma 2's four norms, not five (+2.4%),
        # and the tied embedding's gradient added into lm_head's fp32 .grad in place (+7.8% reserved before both)
        ("h26_qwen3_06b_mixed_b8.json.gz", "qwen3-0.6b --batch 8 --seq 2048 --precision mixed", 0.006),
        ("h26_gemma2_2b_mixed_b2.json.gz", "gemma-2-2b --batch 2 --seq 2048 --precision mixed", 0.006),
        # Gemma 3 in bf16 on the generic layer: its norms keep the fp32 y, the post-norms' outputs are not kept
        ("h27_gemma3_1b_bf16_b4.json.gz", "gemma-3-1b --batch 4 --seq 1024", 0.006),
        # LoRA over fp32 weights under autocast: the frozen weights' copies per linear, lm_head's too
        (
            "h28_lora_llama1b_mixed_b4.json.gz",
            "llama-3.2-1b --method lora --batch 4 --seq 2048 --precision mixed",
            0.01,
        ),
    ],
)
def test_generic_layer_keeps_what_the_gpu_kept(name: str, job: str, rel: float) -> None:
    """Held-out set 25 (blind: llama-3.2-1b -3.1%, gpt2-medium -5.0% on the reserve): o_proj keeps attention's bf16
    output with no cast of its own, lm_head's weight copy lives until its backward, and GPT-2's gelu_new keeps x's
    fp32 copy (pow is on autocast's fp32 list), not x; then the histories recorded after it. The allocated peak
    within 0.5% of the history's, the reserve within `rel` of the recorded requests' replay (LoRA: -0.8%)."""
    from gpuready.memory import estimate
    from gpuready.memory.lm.programs import train_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / name)
    w = workload_from_args(job)
    compute = compare_program(doc, train_program(resolve_model(w.model), w))[0]
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=rel)
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.005)


@pytest.mark.parametrize(
    ("name", "job", "rel"),
    [
        ("h29_vit_l16_mixed_b32", "vit_l_16 --batch 32 --image-size 224 --precision mixed", 0.01),
        ("h29_hf_vitl_mixed_b64", "vit-large-p16-224 --batch 64 --precision mixed", 0.01),
        # cuDNN's patch-convolution workspaces here are 3.75x and 4.40x its output; the program takes 4x and 5x
        # (vision_hf.PATCH_CONV_WORKSPACE), and the segments they make differ
        ("h30_hf_vitb_bf16_b128", "vit-base-p16-224 --batch 128 --precision bf16", 0.03),
        # session 11, recorded after the program followed the three above (held-out set 30, round 11)
        ("h31_vitb16_mixed_b32_384", "vit_b_16 --batch 32 --image-size 384 --precision mixed", 0.02),
        ("h32_vitl16_bf16_b64", "vit_l_16 --batch 64 --image-size 224 --precision bf16", 0.01),
        ("h32_siglip_b_bf16_b64", "siglip-b-p16-224 --batch 64 --precision bf16", 0.01),
        # session 12: held-out set 32's one miss (+6.3%), each weight gradient of q/k/v and of the pooling head its own
        ("h35_siglip_so400m_bf16_b24", "siglip-so400m-384 --batch 24 --precision bf16", 0.01),
        ("h35_siglip_so400m_bf16_b16", "siglip-so400m-384 --batch 16 --precision bf16", 0.01),
    ],
)
def test_vit_training_keeps_what_the_histories_keep(name: str, job: str, rel: float) -> None:
    """torchvision's and transformers' ViT in training, layer by layer as recorded: parameters, optimizer states and
    temporaries tensor by tensor (as one block each the program made four 1.1 GiB segments the GPU never made,
    +9.4%), the batch held through the steps, autocast's weight copies per Linear, each branch's last output until
    its add, torchvision's contiguous copies for its transposed sums, the bias gradients' reduction buffers and the
    patch convolution's workspaces. The replay of the program against the replay of the recorded requests, and the
    peak allocated against the GPU's."""
    from gpuready.memory import estimate
    from gpuready.memory.vision import vision_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / f"{name}.json.gz")
    w = workload_from_args([*job.split(), "--task", "train"])
    compute = compare_program(doc, vision_program(resolve_model(w.model), w))[0]
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=rel)
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.015)


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("h36_resnet50_inf_bf16_b2048", "resnet50 --batch 2048 --precision bf16"),
        ("h36_resnet101_inf_bf16_b1888_cap16", "resnet101 --batch 1888 --precision bf16"),
        # past 2**31 elements per map: batch norm's fp32 copy of its input (11.96 GiB here); recorded under a 40 GiB
        # card's cap, where it ran
        ("h36_resnet50_inf_bf16_b4000_cap40", "resnet50 --batch 4000 --precision bf16"),
        # fp16: the stem's workspace 1.25x its output, not bf16's 1.5x (+13.3% blind on held-out set 35's resnet18,
        # +4.3 and +4.9% on the two fp16 rows before)
        ("h40_infer_resnet18_fp16_b1024", "resnet18 --batch 1024 --precision fp16"),
        ("h41_resnet50_inf_fp16_b512", "resnet50 --batch 512 --precision fp16"),
    ],
)
def test_resnet_inference_keeps_what_the_histories_keep(name: str, job: str) -> None:
    """ResNet under no_grad as recorded: each convolution's output, then cuDNN's workspace for it a moment (1.5x the
    stem's output, 2x a 3x3's, 5x a strided 3x3's, 3x the strided 1x1 projection's), batch norm's output, a block's
    input until it returns, and from 2**31 elements on batch norm's fp32 copy of its input. Peak allocated against
    the GPU's; uncapped, the program's replay against the recorded requests'."""
    from gpuready.memory import estimate
    from gpuready.memory.vision import vision_program
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / f"{name}.json.gz")
    w = workload_from_args([*job.split(), "--task", "infer"])
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.002)
    if "_cap" not in name or name.endswith("cap16"):  # (16 GiB: the cap never bit, 0 segments released)
        compute = compare_program(doc, vision_program(resolve_model(w.model), w))[0]
        assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.002)


def test_adamw8bit_states_are_the_recorded_requests_in_order() -> None:
    # bitsandbytes 0.50.2 (h41_adamw8bit_smollm2_b10): the two quantization maps once, then per parameter two uint8
    # states and two fp32 absmax vectors (one value per 256 elements); fp32 states under 4,096 elements
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "h41_adamw8bit_smollm2_b10.json.gz")
    recorded = [e.nbytes for e in history_streams(doc, depth=3)[0] if e.alloc and "optimizer.py" in e.label]
    w = workload_from_args("smollm2-1.7b --optim adamw8bit --grad-ckpt --seq 2048 --batch 10")
    prog = _build(resolve_model(w.model), w)
    handles = [h for h, cat in enumerate(prog.categories) if cat == "optimizer_states" and h]
    assert [prog.sizes[h] for h in handles] == [-(-n // 512) * 512 for n in recorded]
    assert len(recorded) == 776


@pytest.mark.parametrize(
    ("name", "job"),
    [
        # GPT-NeoX with LoRA and checkpointing: peft's fp32 copies and lora_B outputs in the checkpointed first
        # pass of each of the four linears (384 MiB for the fused query_key_value); -5.2% before (held-out set 33)
        ("h37_lora_pythia1b_ckpt_b8", "pythia-1b --method lora --seq 2048 --batch 8 --precision bf16 --grad-ckpt"),
        # Gemma 2's final logit soft-capping in prefill: / cap, tanh, * cap, two logits tensors live; -3.4% before
        ("h37_prefill_gemma2_27b_b2", "gemma-2-27b --task infer --seq 2048 --batch 2 --precision bf16"),
        # held-out set 34: GPT-2 under peft's checkpointing, its embeddings (the dropout's mask kept, the token
        # embeddings and the residual gradient held to the next step) and the first pass's dropouts; -2.3% before
        ("h38_lora_gpt2m_ckpt_b16", "gpt2-medium --method lora --grad-ckpt --seq 1024 --batch 16 --precision bf16"),
        # round 13: 8-bit AdamW's states as bitsandbytes makes them and the final norm's backward with its weight
        # training (its small pool was 25 segments short before, and the large free blocks at the step differed)
        ("h41_adamw8bit_smollm2_b10", "smollm2-1.7b --optim adamw8bit --grad-ckpt --seq 2048 --batch 10"),
        # GPT-NeoX's checkpointed first pass in train mode adds the residual before it drops the attention's and the
        # MLP's outputs (held-out set 35, QLoRA: -3.4% before)
        ("h40_qlora_pythia1b_ckpt_b8", "pythia-1b --method qlora --grad-ckpt --seq 2048 --batch 8 --precision bf16"),
        # session 16: GPT-2's Conv1D bias gradients take CUDA's reduction buffer (50 MiB for c_fc over 1024 tokens),
        # a new segment each layer once the kept weight gradient has taken the last one (-2.9% before); and its
        # embeddings (token, position, their sum, dropout's mask and output) in every training job
        ("ft_gpt2xl_sgd", "gpt2-xl --seq 1024 --batch 1 --precision fp32 --optim sgd"),
        # Qwen3's head norms under autocast over fp32 weights on the recorded mixed layer: RoPE on their fp32 output,
        # their backward with the weight's reduction over tokens x heads (-2.2% before, on the generic layer)
        ("h52_ft_qwen3_4b_mixed_b1", "qwen3-4b --seq 2048 --batch 1 --precision mixed"),
        # session 17: phi-3's fused qkv_proj and gate_up_proj in a checkpointed QLoRA layer's first pass dequantize
        # their 4-bit weights (and down_proj after the fused MLP too), and its weights are built o_proj first (-0.9%
        # before; max-batch set 30's 24 GiB case predicted 3 where 4 ran)
        ("h54_qlora_phi4_ckpt_b2_s4096", "phi-4 --method qlora --grad-ckpt --seq 4096 --batch 2 --precision bf16"),
        # a sliding-window layer's cache (DynamicSlidingWindowLayer) makes the new K and V before the old two go
        # (cache_utils.py:251/252; a plain DynamicLayer frees each at once): phi-3-mini 16 x 512 + 256 -1.7% before
        ("gen_phi3_b16", "phi-3-mini --task infer --seq 512 --batch 16 --new-tokens 256 --precision bf16"),
        # generate()'s int64 [B, L] bookkeeping (two model_kwargs tensors and input_ids, grown each step, and the mask
        # check's copy) takes the free tails of the KV cache's segments once past 1 MiB; a preset built without an
        # eos_token_id (Qwen's config classes have no default) gets no minimum-length processors: -2.4% before
        ("h57_gen_qwen3_06b_b128", "qwen3-0.6b --task infer --seq 1024 --batch 128 --new-tokens 64 --precision bf16"),
        # session 18: generate()'s attention mask inferred from the padding where the model has an end-of-sequence
        # token (three more int64 [B, S] temporaries), and its position ids kept to the end; past 1 MiB they take
        # large-pool blocks ahead of the prefill (max-batch set 33: 176 predicted on 24 GiB where 175 ran; 22.05 GiB
        # reserved uncapped where the GPU reserved 24.11)
        (
            "h66_gen_sample_llama1b_b176",
            "llama-3.2-1b --task infer --seq 1024 --batch 176 --new-tokens 64 --precision bf16 --decoding sample",
        ),
    ],
)
def test_held_out_misses_follow_their_histories(name: str, job: str) -> None:
    from gpuready.memory import estimate
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / f"{name}.json.gz")
    w = workload_from_args(job.split())
    compute = compare_program(doc, _build(resolve_model(w.model), w))[0]
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.002)
    large = {k: v for k, v in compute.history_segments.items() if k > 2 << 20}
    assert {k: v for k, v in compute.program_segments.items() if k > 2 << 20} == large
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.011)


@pytest.mark.parametrize(
    ("name", "job"),
    [
        # session 16 (held-out sets 45 and 46): Gemma 3 on the recorded layer, q/k/v projected before their fp32 head
        # norms (+14.9% on the reserve before, the generic layer's fused q/k norm blocks); past the sliding window the
        # mask's bf16 copy kept per layer and, for a fused qkv_proj, the attention output's contiguous copy (phi-3:
        # -3.4% allocated before); K/V repeated for grouped heads; fp32 routed experts under autocast (-3.3%)
        ("h50_ft_gemma3_1b_b4", "gemma-3-1b --seq 2048 --batch 4 --precision bf16"),
        ("h50_lora_phi3mini_b2_s4096", "phi-3-mini --method lora --seq 4096 --batch 2 --precision bf16"),
        ("h50_lora_qwen15moe_mixed_b2", "qwen1.5-moe-a2.7b --method lora --seq 1024 --batch 2 --precision mixed"),
        ("h51_lora_gemma3_1b_b4", "gemma-3-1b --method lora --seq 2048 --batch 4 --precision bf16"),
        ("h51_lora_gemma3_4b_b1_s4096", "gemma-3-4b --method lora --seq 4096 --batch 1 --precision bf16"),
        ("h51_lora_mistral7b_b1_s4096", "mistral-7b --method lora --seq 4096 --batch 1 --precision bf16"),
        # GPT-2's embeddings' backward: dropout's gradient held until the token embedding's weight gradient is made,
        # the position embedding's summed over the batch, then its .grad (+2.4% before: held-out set 47)
        ("h53_ft_gpt2l_fp32_b4", "gpt2-large --seq 1024 --batch 4 --precision fp32"),
        # a plain forward's positions are [1, S]: its rotary tables are one sequence's (+1.6% before: set 44)
        ("h49_prefill_gemma3_4b_b8", "gemma-3-4b --task infer --seq 2048 --batch 8 --precision bf16"),
    ],
)
def test_session_16_histories_are_followed_to_the_reserve(name: str, job: str) -> None:
    """The reserve within 0.2% of the recorded requests' replay and the allocated peak within 0.3% of the GPU's (a
    few segments still come out of other sizes: two 36 MiB norm segments of gemma-3-1b's 254 are 32 MiB ones here,
    gpt2-large's step 2 makes one 80 MiB segment fewer and four 20 MiB ones more)."""
    from gpuready.memory import estimate
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / f"{name}.json.gz")
    w = workload_from_args(job.split())
    compute = compare_program(doc, _build(resolve_model(w.model), w))[0]
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.002)
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.003)


def test_resnet_inference_in_fp16_and_fp32_as_recorded() -> None:
    """fp16 makes no fp32 copy in batch norm past 2**31 elements (h39_resnet50_inf_fp16_b3000_cap24), and fp32's
    convolutions take their own workspaces (h39_resnet18_inf_fp32_b1508_cap16). fp16's workspaces past 2**31 are
    taken at the largest recorded (6.0 GiB where its stem took 5.0): over, never under."""
    from gpuready.memory import estimate
    from gpuready.workload import Workload, workload_from_args

    def job(args: str) -> Workload:
        return workload_from_args(args.split())

    fp32 = load_history(HISTORIES / "h39_resnet18_inf_fp32_b1508_cap16.json.gz")
    w = job("resnet18 --task infer --precision fp32 --batch 1508")
    assert estimate(w).peak_allocated_bytes == pytest.approx(fp32["peak_allocated_bytes"], rel=0.01)
    fp16 = load_history(HISTORIES / "h39_resnet50_inf_fp16_b3000_cap24.json.gz")
    predicted = estimate(job("resnet50 --task infer --precision fp16 --batch 3000"))
    assert fp16["peak_allocated_bytes"] <= predicted.peak_allocated_bytes <= 1.08 * fp16["peak_allocated_bytes"]
    copy = 3000 * 64 * 112 * 112 * 4  # the bf16 job's batch-norm copy at this batch
    bf16 = estimate(job("resnet50 --task infer --precision bf16 --batch 3000"))
    assert bf16.peak_allocated_bytes - predicted.peak_allocated_bytes > 0.5 * copy


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("h40_train_resnet18_bf16_b512", "resnet18 --batch 512 --precision bf16"),
        ("h34_resnet50_bf16_b128", "resnet50 --batch 128 --precision bf16"),
        ("h34_resnet18_fp32_b64_320", "resnet18 --batch 64 --image-size 320 --precision fp32"),
        ("h41_resnet101_train_mixed_b96", "resnet101 --batch 96 --precision mixed"),
    ],
)
def test_resnet_training_keeps_what_the_histories_keep(name: str, job: str) -> None:
    """ResNet training op by op (memory/resnet_train.py): peak allocated within 1% of the GPU's in basic and
    bottleneck blocks, in bf16, fp32 and under autocast (within 0.5-4.4% before); the reserve at least the replay's
    and at most 12% over the GPU's (the floor of six largest feature maps)."""
    from gpuready.memory import estimate
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / f"{name}.json.gz")
    est = estimate(workload_from_args([*job.split(), "--task", "train"]))
    assert est.peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.01)
    assert -0.05 < est.peak_reserved_bytes / doc["peak_reserved_bytes"] - 1 < 0.12


def test_gpt_oss_attention_sinks_run_their_softmax_in_bf16() -> None:
    """gpt-oss's eager attention with sinks (h42_gen_gptoss20b_b4): the scores with a sink column concatenated, their
    row max, the max subtracted and softmax in bf16, where the Llama eager path upcasts to fp32 (held-out set 37:
    +16.7% reserved, +8.7% allocated before); the attention's 2 GiB segments the history's."""
    from gpuready.memory import estimate
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "h42_gen_gptoss20b_b4.json.gz")
    w = workload_from_args("gpt-oss-20b --task infer --seq 2048 --new-tokens 64 --batch 4 --precision bf16")
    compute = compare_program(doc, _build(resolve_model(w.model), w))[0]
    assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.002)
    big = {k: v for k, v in compute.history_segments.items() if k > 100 << 20}
    assert {k: v for k, v in compute.program_segments.items() if k > 100 << 20} == big
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.002)


def test_the_sliding_window_mask_is_built_and_kept_as_recorded() -> None:
    """Training past Mistral's 4096-token window: SDPA's boolean mask is built after the embedding in four [S, S]
    steps (the window's, its `and`, the causal one, the `and` of both), one kept until the backward is done
    (h55_ft_mistral7b_ckpt_b1_s8192: 64 MiB each at 8192 tokens; none of them were modelled before)."""
    from gpuready.memory.estimate import _build
    from gpuready.memory.history import StreamEvent, program_streams
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    square = 8192 * 8192
    doc = load_history(HISTORIES / "h55_ft_mistral7b_ckpt_b1_s8192.json.gz")
    w = workload_from_args(["mistral-7b", "--grad-ckpt", "--seq", "8192", "--batch", "1", "--precision", "bf16"])
    streams = (history_streams(doc)[0], program_streams(_build(resolve_model(w.model), w))[0])

    def mask_steps(events: list[StreamEvent]) -> tuple[list[bool], int, int]:
        """The [S, S] events between the embedding's output and the first layer's fp32 norm; where the kept one is
        freed and where the last 224 MiB MLP tensor of the first step's backward is made."""
        first = next(i for i, e in enumerate(events) if e.alloc and e.nbytes == square)  # the embedding
        norm = next(i for i, e in enumerate(events) if i > first and e.alloc and e.nbytes == 2 * square)
        steps = [(e.alloc, e.key) for e in events[first + 1 : norm] if e.nbytes == square]
        live = {key for alloc, key in steps if alloc} - {key for alloc, key in steps if not alloc}
        freed = next(i for i, e in enumerate(events) if not e.alloc and e.key in live and i > norm)
        logits = next(i for i, e in enumerate(events) if e.alloc and e.nbytes == 1000 * MIB)
        last_mlp = max(i for i, e in enumerate(events[:freed]) if e.alloc and e.nbytes == 224 * MIB)
        return [alloc for alloc, _ in steps], logits, last_mlp

    (gpu, gpu_logits, gpu_mlp), (ours, our_logits, our_mlp) = (mask_steps(s) for s in streams)
    assert gpu == ours == [True, True, False, True, True, False, False]
    assert gpu_mlp > gpu_logits and our_mlp > our_logits  # kept through the whole backward


def test_expert_lora_factors_and_the_mla_norm_as_recorded() -> None:
    """peft's expert adapters keep lora_B and lora_A cast to the experts' bf16 for baddbmm's backward (four tensors a
    MoE layer, made at the parametrization's check), and DeepSeek's kv_a_layernorm keeps the fp32 copy of the latent's
    kv_lora_rank part only (h55_qlora_deepseekv2lite_b2: the allocated peak -0.8% before, 26 x 25.75 MiB of factors
    and 27 x 1 MiB too much norm)."""
    from gpuready.memory import estimate
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "h55_qlora_deepseekv2lite_b2.json.gz")
    w = workload_from_args(["deepseek-v2-lite", "--method", "qlora", "--seq", "2048", "--batch", "2"])
    assert estimate(w).peak_allocated_bytes == pytest.approx(doc["peak_allocated_bytes"], rel=0.001)
    factors = [e.nbytes for e in history_streams(doc)[0] if e.alloc and "get_delta_factors" in e.label]
    assert factors[:4] == [4 * MIB, 2816 * KIB, 11 * MIB, 8 * MIB]  # down's B and A, then gate_up's (bf16)


def test_a_full_checkpointed_layer_recompute_stops_before_down_proj() -> None:
    """Non-reentrant checkpointing stops the recompute at the last saved tensor; under full fine-tuning that is
    down_proj's input, which autograd saves before the matmul runs: no down_proj output, no residual add
    (h55_ft_mistral7b_ckpt_b1_s8192: +4.3% on the reserve when the program recomputed the whole layer, +1.4% now)."""
    from gpuready.memory.estimate import _build
    from gpuready.memory.history import StreamEvent, program_streams
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "h55_ft_mistral7b_ckpt_b1_s8192.json.gz")
    w = workload_from_args(["mistral-7b", "--grad-ckpt", "--seq", "8192", "--batch", "1", "--precision", "bf16"])

    def after_the_product(events: list[StreamEvent]) -> list[int]:
        """The sizes (MiB) allocated between the last layer's recomputed MLP product and down_proj's weight
        gradient: the recompute's four 224 MiB MLP tensors, then the first 112 MiB weight gradient."""
        start = next(i for i, e in enumerate(events) if e.alloc and e.nbytes == 1000 * MIB)  # the loss
        mlp = [i for i, e in enumerate(events) if i > start and e.alloc and e.nbytes == 224 * MIB]
        product = mlp[3]
        grad = next(i for i, e in enumerate(events) if i > product and e.alloc and e.nbytes == 112 * MIB)
        return [e.nbytes // MIB for e in events[product + 1 : grad] if e.alloc and e.nbytes >= MIB]

    ours = program_streams(_build(resolve_model(w.model), w))[0]
    assert after_the_product(history_streams(doc)[0]) == after_the_product(ours) == []


def test_a_frozen_4bit_shared_expert_runs_in_module_order() -> None:
    """DeepSeek's shared expert under QLoRA (frozen by peft's expert conversion): each 4-bit weight dequantized
    while its output is made, gate, silu, up, the product, down (h55_qlora_deepseekv2lite_b2; the program had made
    the three weights transient before any output, and no product or down_proj weight at all)."""
    from gpuready.memory.estimate import _build
    from gpuready.memory.history import StreamEvent, program_streams
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / "h55_qlora_deepseekv2lite_b2.json.gz")
    w = workload_from_args(["deepseek-v2-lite", "--method", "qlora", "--seq", "2048", "--batch", "2"])

    def shared_expert(events: list[StreamEvent]) -> list[tuple[bool, int]]:
        """The 1 MiB-and-over events from the first 11 MiB weight whose 22 MiB output follows it."""
        big = [(e.alloc, e.nbytes // MIB) for e in events if e.nbytes >= MIB]
        start = next(i for i in range(len(big) - 1) if big[i] == (True, 11) and big[i + 1] == (True, 22))
        return big[start : start + 12]

    ours = shared_expert(program_streams(_build(resolve_model(w.model), w))[0])
    assert shared_expert(history_streams(doc)[0]) == ours
    assert [n for alloc, n in ours if alloc] == [11, 22, 22, 11, 22, 22, 11, 16]


def _decode_peak_allocated(events: list, first_label: str) -> int:
    """The most bytes allocated at once from the first allocation whose label has `first_label` on."""
    live, peak, started = 0, 0, False
    for ev in events:
        live += ev.nbytes if ev.alloc else -ev.nbytes
        started = started or (ev.alloc and first_label in ev.label)
        if started:
            peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    ("name", "job"),
    [
        # session 18: generate(do_sample=True) with temperature, top-k 50 and top-p 0.9 (--decoding sample): the
        # warpers' fp32 scores, top-p's torch.sort (values, int64 indices and cub's scratch: about 44 bytes per
        # vocabulary entry and row at once), softmax's probabilities kept to the next step, multinomial's scratch.
        # Greedy's program is 144-405 MiB short of these decode peaks; the prefill sets each job's own peak
        ("h58_gen_sample_qwen25_05b_b32", "qwen2.5-0.5b --task infer --seq 512 --batch 32 --new-tokens 128"),
        ("h59_gen_sample_qwen3_4b_b64", "qwen3-4b --task infer --seq 1024 --batch 64 --new-tokens 64"),
        (
            "h60_gen_sample_llama1b_fp16_b32",
            "llama-3.2-1b --task infer --seq 512 --batch 32 --new-tokens 64 --precision fp16",
        ),
        ("h61_gen_sample_gemma2_2b_b16", "gemma-2-2b --task infer --seq 1024 --batch 16 --new-tokens 64"),
        # torch.sort's other two paths: 128 rows and more (cub's segmented sort: 12 bytes an element fewer than the
        # full sort, held-out set 52's +2.8 ... +11.3% on the allocated peak before), and one row
        ("h62_gen_sample_qwen25_05b_b256", "qwen2.5-0.5b --task infer --seq 128 --batch 256 --new-tokens 16"),
        ("h63_gen_sample_gemma3_1b_b128", "gemma-3-1b --task infer --seq 128 --batch 128 --new-tokens 16"),
        ("h64_gen_sample_qwen3_06b_b1", "qwen3-0.6b --task infer --seq 512 --batch 1 --new-tokens 16"),
    ],
)
def test_sampling_warpers_follow_their_histories(name: str, job: str) -> None:
    from gpuready.memory.estimate import _build
    from gpuready.models import resolve_model
    from gpuready.workload import workload_from_args

    doc = load_history(HISTORIES / f"{name}.json.gz")
    recorded = _decode_peak_allocated(history_streams(doc, 1)[0], "_sample@utils.py:3042")
    peaks = {}
    for decoding in ("greedy", "sample"):
        w = workload_from_args([*job.split(), "--decoding", decoding])
        prog = _build(resolve_model(w.model), w)
        peaks[decoding] = prog.phase_peaks["decode"]
        if decoding == "sample":
            compute = compare_program(doc, prog)[0]
            assert compute.program_reserved_bytes == pytest.approx(compute.history_reserved_bytes, rel=0.002)
    assert peaks["sample"] == pytest.approx(recorded, abs=2 * MIB)
    assert recorded - peaks["greedy"] > 5 * MIB
