"""One contrastive training step of the full-size QFF (ViT-g, 12-layer Q-Former, 32 queries) with random weights on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkvqa.qff.builder import ITM_VIT_G_CONFIG
from qkvqa.qff.model import QFFModel
from qkvqa.qff.scoring import late_interaction

pytestmark = pytest.mark.slow


def test_fullsize_training_step_on_one_sample():
    from transformers import Blip2Config, Blip2ForImageTextRetrieval

    torch.manual_seed(0)
    config = Blip2Config(**ITM_VIT_G_CONFIG)
    config.vision_config.initializer_range = 0.02  # random init only; the HF default (1e-10) flattens the ViT
    model = QFFModel(Blip2ForImageTextRetrieval(config), focus="per_layer").train()
    assert (len(model.base.vision_model.encoder.layers), config.vision_config.hidden_size) == (39, 1408)
    assert (model.num_layers, model.num_queries, model.hidden_size, len(model.q_xattn)) == (12, 32, 768, 12)

    # one sample: the question image, the gold article's image and one other article's image (a ViT cache's job)
    pixels = torch.randn(3, 3, 224, 224)
    image_states = model.encode_image(pixels)  # frozen ViT: no graph
    assert image_states.shape == (3, 257, 1408) and not image_states.requires_grad
    question_ids = torch.randint(1000, 30000, (1, 16))
    question = model.encode_question(question_ids, torch.ones_like(question_ids), image_states[:1])
    # 1 positive (gold image, evidence section) + 3 negatives: another gold section, two of the other article
    section_ids = torch.randint(1000, 30000, (4, 48))
    section_mask = torch.ones_like(section_ids)
    section_mask[2:, 30:] = 0
    sections = model.encode_sections(
        section_ids, section_mask, image_states[1:], question, image_index=torch.tensor([0, 0, 1, 1])
    )
    logits = late_interaction(question.tokens, sections)[None] / 0.07
    loss = F.cross_entropy(logits, torch.tensor([0]))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, betas=(0.9, 0.98), eps=1e-7, weight_decay=0.05)
    loss.backward()
    optimizer.step()

    assert torch.isfinite(loss)
    assert (model.q_gate.grad != 0).all() and (model.q_gate.detach() != 0).all()
    assert all(p.grad is None for p in model.base.vision_model.parameters())
    assert model.base.query_tokens.grad.abs().sum() > 0
