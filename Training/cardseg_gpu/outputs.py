"""The run's files in ``OUT``: one JSON line per event in ``log.jsonl``, weights as fp16 safetensors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict

import torch


def log_line(out: Path, record: dict) -> None:
    """Append one JSON line to ``OUT/log.jsonl`` (short appends from several processes interleave whole)."""
    record = {"time": round(time.time(), 2), **record}
    with open(out / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def save_weights(path: Path, tensors: Dict[str, torch.Tensor], meta: dict) -> None:
    """fp16 safetensors (floating tensors halved), written beside and renamed into place."""
    from safetensors.torch import save_file

    half = {
        k: (v.detach().to("cpu", torch.float16) if v.is_floating_point() else v.detach().cpu()).contiguous()
        for k, v in tensors.items()
    }
    tmp = path.with_name(path.name + ".part")
    save_file(half, str(tmp), metadata={"cardseg": json.dumps(meta)})
    os.replace(tmp, path)
