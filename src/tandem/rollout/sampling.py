"""Token choice for one decode step: greedy / temperature, top-k, top-p, seeded per-row draws.

Pure tensor functions, so that any rollout engine that decodes by itself uses the same rules,
and so that they can be tested on hand-written logits.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from tandem.rollout.base import SamplingParams


def filter_top_k_top_p(scaled_logits: Tensor, top_k: int = -1, top_p: float = 1.0) -> Tensor:
    """Logits with the tokens outside top-k, then outside the top-p nucleus, set to -inf; (B, V) -> (B, V).

    top-k keeps every token tied with the k-th largest logit. top-p keeps the smallest set of most
    likely tokens whose probability (after top-k) reaches ``top_p``; the most likely token always stays.
    """
    out = scaled_logits
    vocab = out.shape[-1]
    if 1 <= top_k < vocab:
        kth = out.topk(top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # A token is dropped when the more likely tokens before it already hold top_p of the mass.
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def row_generators(seed: int, rows: Tensor, device: torch.device) -> list[torch.Generator]:
    """One generator per row, seeded from (seed, global row index): a row's draws then do not depend
    on which other rows share its batch, so chunking the batch cannot change the samples."""
    generators = []
    for row in rows.tolist():
        # SeedSequence mixes the pair, so seed s row r+1 and seed s+1 row r start unrelated streams.
        state = np.random.SeedSequence([seed, row]).generate_state(1, dtype=np.uint64)[0]
        generators.append(torch.Generator(device=device).manual_seed(int(state)))
    return generators


def choose_tokens(
    logits: Tensor,
    sampling: SamplingParams,
    generators: list[torch.Generator] | None = None,
    active: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Next tokens and their log-probs under the sampling distribution; (B, V) float32 -> (B,), (B,).

    Greedy (temperature 0): argmax, log-prob from log_softmax(logits) (T = 1). Otherwise a draw from
    softmax(filter(logits / T)), log-prob from log_softmax(logits / T): top-k / top-p decide what may be
    drawn but do not renormalise the number (the trainer recomputes it without the filters).
    ``generators`` (one per row) make the draws reproducible; None uses torch's global RNG. Rows with
    ``active`` False are skipped (their token is 0) so that their generators are not advanced.
    """
    if sampling.greedy:
        tokens = logits.argmax(dim=-1)
        log_probs = logits.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, log_probs
    scaled = logits / sampling.temperature
    log_probs_all = scaled.log_softmax(dim=-1)
    probs = filter_top_k_top_p(scaled, sampling.top_k, sampling.top_p).softmax(dim=-1)
    if generators is None:
        tokens = torch.multinomial(probs, 1).squeeze(-1)
    else:
        tokens = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        rows = range(logits.shape[0]) if active is None else active.nonzero().flatten().tolist()
        # One draw per row from its own stream: the price of chunk-independent seeded samples.
        for i in rows:
            tokens[i] = torch.multinomial(probs[i], 1, generator=generators[i])[0]
    log_probs = log_probs_all.gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, log_probs
