"""``charlm``: a small byte-level transformer language model trained on Python's own standard library.

The corpus is on every machine that runs a rank: a fixed, sorted list of pure-Python modules of
CPython 3.11+ (``CORPUS_MODULES``, any missing one skipped), the first ``FILE_BYTES`` of each. Each
file's first 90% is training text, its last 10% held-out text never trained on. Tokens are bytes
(vocabulary 256). The ranks of one job must see the same files: they do when they run the same
Python (one machine, one image); ``corpus_digest`` names the corpus so that a mismatch can be told.

A training sample is ``CONTEXT`` tokens and the ``CONTEXT`` next tokens. The training text is cut
into non-overlapping windows at an offset drawn per epoch, so an epoch reads (nearly) every byte
once and different epochs cut it differently.

The model (``CharTransformer``): token and learned position embeddings of width ``spec.hidden``,
``CHARLM_LAYERS`` pre-norm blocks (LayerNorm, causal multi-head self-attention through
``scaled_dot_product_attention``, LayerNorm, a GELU feed-forward of 4x width), a final LayerNorm and
a linear head to 256 logits. No dropout and no batch statistics, so a sequence's loss does not depend
on which other sequences share its batch. AdamW at ``spec.lr``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from runtime.jobspec import WorkloadSpec
from runtime.worker.builtin.base import EpochOrder, evaluating, seeded_weights, stream_generator
from runtime.worker.builtin.shapes import (
    CHARLM_CONTEXT,
    CHARLM_FF_MULT,
    CHARLM_LAYERS,
    CHARLM_VOCAB,
    charlm_heads,
    memory_figures,
)

# Single-file modules of every CPython from 3.11 on (paths relative to the standard library folder).
CORPUS_MODULES = (
    "argparse.py",
    "ast.py",
    "calendar.py",
    "configparser.py",
    "contextlib.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "gettext.py",
    "gzip.py",
    "heapq.py",
    "inspect.py",
    "ipaddress.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "pickle.py",
    "pprint.py",
    "queue.py",
    "random.py",
    "shlex.py",
    "shutil.py",
    "socket.py",
    "statistics.py",
    "string.py",
    "subprocess.py",
    "tarfile.py",
    "tempfile.py",
    "textwrap.py",
    "threading.py",
    "tokenize.py",
    "traceback.py",
    "typing.py",
    "uuid.py",
    "weakref.py",
)
FILE_BYTES = 32_768  # per module: the corpus stays about 1 MB and no one file dominates it
HELDOUT_FRACTION = 0.1
EVAL_SEQUENCES = 256  # held-out windows per evaluation, evenly spaced over the held-out text
EVAL_CHUNK = 64
ADAM_BETAS = (0.9, 0.99)
WEIGHT_DECAY = 0.01
INIT_STD = 0.02

_STREAM_OFFSET = 11
_STREAM_ORDER = 12


@functools.cache
def load_corpus() -> tuple[bytes, bytes, str]:
    """(training text, held-out text, sha256 of both): the same on every call."""
    stdlib = Path(os.__file__).parent
    train: list[bytes] = []
    heldout: list[bytes] = []
    for name in CORPUS_MODULES:
        path = stdlib / name
        if not path.is_file():
            continue
        text = path.read_bytes()[:FILE_BYTES]
        cut = int(len(text) * (1 - HELDOUT_FRACTION))
        train.append(text[:cut])
        heldout.append(text[cut:])
    train_text, heldout_text = b"\n\n".join(train), b"\n\n".join(heldout)
    if len(heldout_text) < 2 * (CHARLM_CONTEXT + 1):
        raise RuntimeError(f"the standard library at {stdlib} has too few of the corpus modules")
    digest = hashlib.sha256(train_text + b"\0" + heldout_text).hexdigest()
    return train_text, heldout_text, digest


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(batch, length, width))
        return out


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.feed_forward = nn.Sequential(
            nn.Linear(d_model, CHARLM_FF_MULT * d_model), nn.GELU(), nn.Linear(CHARLM_FF_MULT * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        out: torch.Tensor = x + self.feed_forward(self.norm2(x))
        return out


class CharTransformer(nn.Module):
    """Bytes in (batch, length <= context), next-byte logits out (batch, length, 256)."""

    def __init__(self, d_model: int, context: int = CHARLM_CONTEXT, layers: int = CHARLM_LAYERS) -> None:
        super().__init__()
        self.context = context
        self.token = nn.Embedding(CHARLM_VOCAB, d_model)
        self.position = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, charlm_heads(d_model)) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, CHARLM_VOCAB)
        # Small initial weights (as GPT-2 has them): the first loss is close to ln 256, the loss of
        # knowing nothing, and early steps are stable at the default learning rate.
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def sequence_losses(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each sequence's mean next-byte cross-entropy, shape (batch,)."""
    logits = model(inputs)
    per_token = F.cross_entropy(logits.reshape(-1, CHARLM_VOCAB), targets.reshape(-1), reduction="none")
    return per_token.view(targets.shape).mean(dim=1)


class CharLmTask:
    """Next-byte prediction on standard-library source; figures: ``val_loss`` (nats per byte)."""

    name = "charlm"
    eval_every = 50

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        train_text, heldout_text, self.corpus_digest = load_corpus()
        self.train_tokens = torch.frombuffer(bytearray(train_text), dtype=torch.uint8)
        self.heldout_tokens = torch.frombuffer(bytearray(heldout_text), dtype=torch.uint8)
        # Windows of CONTEXT + 1 bytes (inputs and their next bytes), one CONTEXT apart, starting at
        # an offset in [0, CONTEXT): as many as fit at the largest offset.
        self.windows = (len(train_text) - 1 - (CHARLM_CONTEXT - 1)) // CHARLM_CONTEXT
        self.order = EpochOrder(self.windows, spec.global_batch, spec.seed, _STREAM_ORDER)
        self.batches_per_epoch = self.order.batches_per_epoch
        self.param_count, self.activation_bytes_per_sample = memory_figures(self.name, spec.hidden)
        self._window = torch.arange(CHARLM_CONTEXT + 1)

    def build_model(self) -> nn.Module:
        with seeded_weights(self.spec.seed):
            return CharTransformer(self.spec.hidden)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.spec.lr, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY)

    def epoch_offset(self, epoch: int) -> int:
        return int(
            torch.randint(CHARLM_CONTEXT, (1,), generator=stream_generator(self.spec.seed, _STREAM_OFFSET, epoch))
        )

    def window_starts(self, step: int) -> torch.Tensor:
        """Where in the training text each sequence of the global batch at ``step`` starts."""
        offset = self.epoch_offset(self.order.epoch_of(step))
        return offset + self.order.indices_at(step) * CHARLM_CONTEXT

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        windows = self.train_tokens[self.window_starts(step)[:, None] + self._window].long()
        return windows[:, :-1], windows[:, 1:]

    def loss_sum(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return sequence_losses(model, inputs, targets).sum()

    def heldout_windows(self) -> torch.Tensor:
        available = (len(self.heldout_tokens) - 1) // CHARLM_CONTEXT
        count = min(EVAL_SEQUENCES, available)
        starts = torch.linspace(0, available - 1, count).long() * CHARLM_CONTEXT
        return self.heldout_tokens[starts[:, None] + self._window].long()

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        windows = self.heldout_windows()
        total = 0.0
        with evaluating(model):
            for chunk in torch.split(windows, EVAL_CHUNK):
                total += sequence_losses(model, chunk[:, :-1], chunk[:, 1:]).sum().item()
        return {"val_loss": total / len(windows)}
