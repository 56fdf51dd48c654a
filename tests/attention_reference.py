"""Attention computed directly in float64 numpy, for the attention tests."""
import numpy as np


def attention_reference(q, k, v, scale, causal=False, window=None, mask=None, sinks=None):
    """`softmax(scale q kᵀ + mask) v` per query head; causal lower-right aligned; a window keeps the
    `window` keys up to a query's last; a boolean mask (true attends) or an additive one; sinks join
    the denominator; a query that sees no key gives zeros."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    scores = scale * q @ np.swapaxes(k, -1, -2)
    lq, lk = scores.shape[-2:]
    visible = np.ones(scores.shape, bool)
    query_pos = np.arange(lq)[:, None] + lk - lq
    key_pos = np.arange(lk)[None, :]
    if causal: visible &= key_pos <= query_pos
    if window is not None: visible &= key_pos > query_pos - window
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_: visible &= np.broadcast_to(mask, scores.shape)
        else: scores = scores + mask
    scores = np.where(visible, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    if sinks is not None:
        sinks = np.asarray(sinks, np.float64)[None, :, None, None]
        top = np.maximum(top, sinks)
    top = np.where(np.isneginf(top), 0.0, top)
    weights = np.exp(scores - top)
    denominator = weights.sum(-1, keepdims=True)
    if sinks is not None: denominator = denominator + np.exp(sinks - top)
    return (weights @ v) / np.where(denominator == 0, 1.0, denominator)
