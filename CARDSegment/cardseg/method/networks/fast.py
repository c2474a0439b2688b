"""Inference-time rewrites that keep a network's function and make it cheaper on the CPU.

:func:`instance_to_group_norm`: an ``InstanceNorm`` without running statistics normalises each
channel of each sample over its spatial positions; ``GroupNorm`` with one group per channel does
the same arithmetic (same ``eps``, same optional per-channel affine), and PyTorch's CPU kernel for
it is several times faster than its instance-norm kernel (``Testing/benchmarks/norms.py``). The
parameters keep their names (``weight``, ``bias``), so state dicts load either way.
"""

from __future__ import annotations

from torch import nn

_INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)


def instance_to_group_norm(net: nn.Module) -> int:
    """Replace, in place, every instance norm of ``net`` that keeps no running statistics by the
    equivalent ``GroupNorm(C, C)`` (weights copied). Returns how many were replaced; norms that
    track running statistics (which normalise differently in eval mode) are left alone."""
    import torch

    swaps = [
        (parent, name, child)
        for parent in net.modules()
        for name, child in parent.named_children()
        if isinstance(child, _INSTANCE_NORMS) and not child.track_running_stats
    ]
    for parent, name, norm in swaps:
        group = nn.GroupNorm(norm.num_features, norm.num_features, eps=norm.eps, affine=norm.affine)
        if norm.affine:  # without an affine part the group norm holds no tensors to place
            group.to(norm.weight.device)
            with torch.no_grad():
                group.weight.copy_(norm.weight)
                group.bias.copy_(norm.bias)
        group.train(norm.training)
        setattr(parent, name, group)
    return len(swaps)
