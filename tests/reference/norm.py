"""Naive float64 references for the norm family, written from the definitions."""

import torch


def layer_norm_stats(h, eps):
    """mean and rstd (1/sqrt(biased variance + eps)) over the last axis, float64."""
    h = h.double()
    mean = h.sum(-1) / h.shape[-1]
    var = ((h - mean.unsqueeze(-1)) ** 2).sum(-1) / h.shape[-1]
    return mean, 1.0 / torch.sqrt(var + eps)


def rms_norm_rstd(h, eps):
    h = h.double()
    return 1.0 / torch.sqrt((h * h).sum(-1) / h.shape[-1] + eps)


def softmax(x):
    x = x.double()
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)
