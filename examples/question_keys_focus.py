"""A QFF focus block outside qkvqa: the question's states as extra keys in the section queries' self-attention.

At every Q-Former layer l, after the stock self-attention, the section's query states attend once more through layer
l's own self-attention weights, to themselves and to the question's layer-l query states (the question as extra keys
and values); the result enters through a tanh gate per layer, closed at step 0 (`qff.gate_init`), so training starts
from the stock Q-Former. Its only new parameters are those gates (`PARAMETER_GROUPS`: no weight decay).

One config line (this folder on PYTHONPATH, or the repository root as here):

    qff:
      focus: examples.question_keys_focus:QuestionKeys

The trained QFF records the import path and the sha256 of this file; it is refused with another focus or after this
file changed (docs/extending.md, "The QFF focus block").
"""

from __future__ import annotations

import torch
from torch import nn

from qkvqa.qff.model import QFFModel


class QuestionKeys(QFFModel):
    """Per-layer focus: the queries' self-attention, its keys and values extended by the question's states."""

    FOCUS_BASE = "per_layer"  # hands focus_block the question's states of every layer
    PARAMETER_GROUPS = {"key_gate": "focus_gates"}

    def build_focus_blocks(self, qcfg, layers, where: dict, gate: str, gate_init: float) -> None:
        self.key_gate = nn.Parameter(torch.full((len(layers),), float(gate_init), **where))

    def focus_block(self, i: int, h: torch.Tensor, question_states: torch.Tensor) -> torch.Tensor:
        layer = self.base.qformer.encoder.layer[i]
        both = torch.cat([h, question_states.to(h.dtype)], dim=1)
        attended = self.attend_block(layer.attention, both, rows=h.shape[1])  # the query rows only
        return h + torch.tanh(self.key_gate[i]) * (attended - h)

    def gate_values(self):
        """tanh of every layer's gate (logged as train/gate)."""
        return torch.tanh(self.key_gate.detach()).reshape(-1)
