"""Language models (Hugging Face transformers, decoder-only) as a program of GPU allocations.

What each op keeps for backward follows PyTorch autograd's formulas and the model code in transformers
(modeling_llama.py and relatives). The parts, by what they model:

- context.py: the job's context (Ctx): dtypes, tokens, what trains, the attention kernel, LoRA's linears;
- weights.py: the parameters as from_config allocates them (and FSDP2's sharding);
- ops.py: ops written once for the blocks (rotary embedding, RMSNorm's pieces, no-grad norm and eager attention,
  rotary tables, eager mask, cuBLAS workspace);
- autograd.py: what a layer keeps for backward and backward's walk over it;
- blocks_recorded.py, blocks_train.py: one decoder layer under autograd; blocks_infer.py: without autograd;
- loss.py: the final norm, logits and loss, generate()'s sampling;
- fsdp.py: FSDP2's all-gather and reduce-scatter buffers;
- programs.py: the whole training job (train_program); infer.py: inference and generate() (infer_program).
"""
