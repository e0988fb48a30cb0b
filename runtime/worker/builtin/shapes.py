"""The built-in models' fixed shapes and memory figures, without torch.

The memory model (``runtime.balancing.max_micro_batch``) needs a model's parameter count and the
bytes one sample keeps for the backward pass; backends and the control plane compute caps without
importing torch, so the figures are formulas here, and the tasks (which build the real modules from
the same constants) are tested to agree with them.

Activation figures count the fp32 tensors autograd keeps per sample, doubled for its temporaries
(``ACTIVATION_OVERHEAD``, as for the synthetic MLP in ``runtime.worker.config``): rough, erring on
the side of more memory.
"""

from __future__ import annotations

ACTIVATION_OVERHEAD = 2.0
FLOAT_BYTES = 4.0

# charlm: a byte-level decoder-only transformer (runtime.worker.builtin.charlm).
CHARLM_VOCAB = 256  # bytes are the tokens
CHARLM_CONTEXT = 64  # tokens per sample
CHARLM_LAYERS = 2
CHARLM_HEAD_DIM = 16  # heads = d_model // 16 (at least 1)
CHARLM_FF_MULT = 4

# digits-cnn: two 3x3 convolutions on 8x8 grey images, a 2x2 max-pool and a linear head
# (runtime.worker.builtin.digits).
DIGITS_SIDE = 8
DIGITS_CLASSES = 10


def charlm_heads(d_model: int) -> int:
    if d_model % CHARLM_HEAD_DIM == 0:
        return max(1, d_model // CHARLM_HEAD_DIM)
    return 1


def charlm_param_count(d_model: int) -> int:
    d, v, t = d_model, CHARLM_VOCAB, CHARLM_CONTEXT
    ff = CHARLM_FF_MULT * d
    per_block = (
        2 * d  # attention LayerNorm
        + 3 * d * d
        + 3 * d  # query, key, value
        + d * d
        + d  # attention output
        + 2 * d  # feed-forward LayerNorm
        + d * ff
        + ff
        + ff * d
        + d  # feed-forward
    )
    return v * d + t * d + CHARLM_LAYERS * per_block + 2 * d + d * v + v


def charlm_activation_bytes(d_model: int) -> float:
    """Per sequence: each layer keeps its input, norm, q/k/v, attention weights before and after the
    softmax (heads x context per token), attention and projection outputs, the second norm and the
    feed-forward's hidden layer before and after GELU; then embeddings, final norm, logits and their
    log-softmax."""
    d, t, heads = d_model, CHARLM_CONTEXT, charlm_heads(d_model)
    ff = CHARLM_FF_MULT * d
    per_token_layer = d + d + 3 * d + 2 * heads * t + d + d + d + 2 * ff + d
    per_token = CHARLM_LAYERS * per_token_layer + 4 * d + 2 * CHARLM_VOCAB
    return ACTIVATION_OVERHEAD * FLOAT_BYTES * t * per_token


def digits_param_count(channels: int) -> int:
    c = channels
    conv1 = 1 * c * 9 + c
    conv2 = c * 2 * c * 9 + 2 * c
    pooled = 2 * c * (DIGITS_SIDE // 2) ** 2
    return conv1 + conv2 + pooled * DIGITS_CLASSES + DIGITS_CLASSES


def digits_activation_bytes(channels: int) -> float:
    """Per image: the input, each convolution's output before and after ReLU, the pooled map, the
    logits and their log-softmax."""
    c, pixels = channels, DIGITS_SIDE**2
    floats = pixels + 2 * c * pixels + 2 * (2 * c) * pixels + 2 * c * (pixels // 4) + 2 * DIGITS_CLASSES
    return ACTIVATION_OVERHEAD * FLOAT_BYTES * floats


def param_shapes(model: str, hidden: int) -> list[tuple[int, ...]]:
    """The shape of every parameter tensor of built-in ``model`` at width ``hidden``, in the modules'
    order: what the gradient exchange sends (``runtime.comm.auto.lowrank_numbers`` sizes PowerSGD on them)."""
    if model == "synthetic-mlp":
        from runtime.worker.config import INPUT_DIM, NUM_CLASSES

        h = hidden
        return [(h, INPUT_DIM), (h,), (h, h), (h,), (NUM_CLASSES, h), (NUM_CLASSES,)]
    if model == "charlm":
        d, ff = hidden, CHARLM_FF_MULT * hidden
        block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (ff, d), (ff,), (d, ff), (d,)]
        return [
            (CHARLM_VOCAB, d),
            (CHARLM_CONTEXT, d),
            *block * CHARLM_LAYERS,
            (d,),
            (d,),
            (CHARLM_VOCAB, d),
            (CHARLM_VOCAB,),
        ]
    if model == "digits-cnn":
        c = hidden
        pooled = 2 * c * (DIGITS_SIDE // 2) ** 2
        return [(c, 1, 3, 3), (c,), (2 * c, c, 3, 3), (2 * c,), (DIGITS_CLASSES, pooled), (DIGITS_CLASSES,)]
    raise ValueError(f"{model!r} is not a built-in model; use one of synthetic-mlp, charlm, digits-cnn")


def memory_figures(model: str, hidden: int) -> tuple[int, float]:
    """(parameter count, activation bytes per sample) of built-in ``model`` at width ``hidden``."""
    if model == "synthetic-mlp":
        # Imported here: runtime.worker.config may import this module for its memory caps.
        from runtime.worker.config import synthetic_mlp_activation_bytes, synthetic_mlp_param_count

        return synthetic_mlp_param_count(hidden), synthetic_mlp_activation_bytes(hidden)
    if model == "charlm":
        return charlm_param_count(hidden), charlm_activation_bytes(hidden)
    if model == "digits-cnn":
        return digits_param_count(hidden), digits_activation_bytes(hidden)
    raise ValueError(f"{model!r} is not a built-in model; use one of synthetic-mlp, charlm, digits-cnn")
