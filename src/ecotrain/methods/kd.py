"""The one knowledge-distillation loss, shared by distillation (a teacher) and LwF (the previous
version): KL(softmax(teacher / T) || softmax(student / T)) * T^2, a mean over the batch's samples.

The T^2 factor (Hinton et al., 2015) keeps the gradient's size independent of the temperature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """Mean over samples (every dim but the last is a sample: sequences count each position)."""
    t = float(temperature)
    s = F.log_softmax(student_logits.float().flatten(0, -2) / t, dim=-1)
    p = F.log_softmax(teacher_logits.detach().float().flatten(0, -2) / t, dim=-1)
    return F.kl_div(s, p, reduction="batchmean", log_target=True) * (t * t)
