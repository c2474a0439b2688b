"""The architectures of the network calibrators (PTS, LTS, CalibNet) and their tensors.

Shared by the calibrators (:mod:`cardseg.method.calibration.netbase`, which raises a problem as a
``ValueError``) and the bundle schema (:mod:`cardseg.bundle.calibration_schema`, which refuses it
in one line).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from cardseg.base.errors import show

#: the small-network calibrators (PTS, LTS, CalibNet: ``cardseg.method.calibration.netbase``), comparison
#: baselines stored under ``baselines`` only (the engine calibrates with ``calibration``, which
#: cannot feed them the image or the augmentation statistics). Their ``arch`` keys: ``(low, high)``
#: for an integer, ``(low, high, max_len)`` for a list of integers.
NET_CALIBRATOR_ARCH: Dict[str, Dict[str, Tuple[int, ...]]] = {
    "pts": {"num_classes": (2, 255), "top_k": (1, 255), "hidden": (1, 64), "layers": (1, 4)},
    "lts": {"num_classes": (2, 255), "kernel": (1, 9), "dilation": (1, 16)},
    "calibnet": {
        "num_classes": (2, 255),
        "branch": (1, 32),
        "hidden": (1, 64),
        "reduction": (1, 160),
        "dae_hidden": (1, 64),
        "dae_dilations": (1, 16, 6),
        "augmentations": (1, 64),
    },
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def net_arch_problem(method: str, arch: Any) -> Optional[Tuple[str, str]]:
    """Why ``arch`` is not a valid architecture of the network calibrator ``method``, as
    ``(key, problem)``, or ``None`` (shared with the engine, which raises it as a ``ValueError``)."""
    spec = NET_CALIBRATOR_ARCH[method]
    if not isinstance(arch, dict):
        return "", f"must be an object (got {show(arch)})"
    for key in arch:
        if key not in spec:
            return key, f"is not a setting of the {method} network (it takes {', '.join(spec)})"
    for key, bounds in spec.items():
        if key not in arch:
            return key, "is missing"
        v = arch[key]
        if len(bounds) == 3:
            low, high, max_len = bounds
            if (
                not isinstance(v, (list, tuple))
                or not 1 <= len(v) <= max_len
                or any(not _is_int(x) or not low <= x <= high for x in v)
            ):
                return key, f"must be a list of 1 to {max_len} integers in [{low}, {high}] (got {show(v)})"
        elif not _is_int(v) or not bounds[0] <= v <= bounds[1]:
            return key, f"must be an integer in [{bounds[0]}, {bounds[1]}] (got {show(v)})"
    if method == "pts" and arch["top_k"] > arch["num_classes"]:
        return "top_k", f"must be <= num_classes ({arch['num_classes']}) (got {arch['top_k']})"
    if method == "lts" and arch["kernel"] % 2 == 0:
        return "kernel", f"must be odd (got {arch['kernel']})"
    if method == "calibnet" and arch["reduction"] > 5 * arch["branch"]:
        return "reduction", f"must be <= 5 * branch ({5 * arch['branch']}) (got {arch['reduction']})"
    return None


def net_weight_shapes(method: str, arch: dict) -> Dict[str, List[int]]:
    """The tensors (name → shape) of a network calibrator with a valid ``arch`` (kept in step with
    the engine's modules by a test)."""
    k = arch["num_classes"]
    shapes: Dict[str, List[int]] = {}

    def conv(name: str, c_out: int, c_in: int, size: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = [c_out, c_in, size, size], [c_out]

    if method == "pts":
        h = arch["hidden"]
        for i in range(arch["layers"]):
            shapes[f"hidden.{i}.weight"], shapes[f"hidden.{i}.bias"] = [h, arch["top_k"] if i == 0 else h], [h]
        shapes["out.weight"], shapes["out.bias"] = [1, h], [1]
    elif method == "lts":  # the authors' tree: 4 leaves and 3 gates on the logits, a leaf and a gate for the image
        size = arch["kernel"]
        for i in range(4):
            conv(f"leaves.{i}", 1, k, size)
        for i in range(3):
            conv(f"gates.{i}", 1, k, size)
        conv("image_leaf", 1, 1, size)
        conv("image_gate", 1, k, size)
    elif method == "calibnet":
        b, c, d = arch["branch"], arch["hidden"], arch["dae_hidden"]
        squeeze = max(1, 5 * b // arch["reduction"])
        for i in range(len(arch["dae_dilations"])):
            conv(f"dae.convs.{i}", d, k if i == 0 else d, 3)
        conv("dae.out", k, d, 3)
        for j in range(5):
            conv(f"branches.{j}", b, 1 if j == 0 else k, 3)
        shapes["se_down.weight"], shapes["se_down.bias"] = [squeeze, 5 * b], [squeeze]
        shapes["se_up.weight"], shapes["se_up.bias"] = [5 * b, squeeze], [5 * b]
        conv("head", c, 5 * b, 3)
        conv("out", 1, c, 3)
    else:
        raise ValueError(f"{method!r} is not a network calibrator")
    return shapes
