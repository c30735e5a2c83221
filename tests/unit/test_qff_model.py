"""The question-focused Q-Former wrapper: stock equality at gate 0, focus modes, batching, gradients, dtypes."""

from __future__ import annotations

import copy

import pytest
import torch

from qkvqa.components import build_component
from qkvqa.config.schema import QFFConfig
from qkvqa.errors import ConfigError
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.model import QFFModel
from qkvqa.qff.scoring import late_interaction

SECTIONS = [
    "# Wiki Article: Grey heron\n## Section Title: Description\nThe grey heron is a large bird with long legs.",
    "# Wiki Article: Grey heron\n## Section Title: Diet\nIt eats fish.",
    "# Wiki Article: Eiffel Tower\n## Section Title: History\nThe tower was built in 1889 for the fair in the city.",
]
QUESTIONS = ["what is the wingspan of this bird?", "when was this landmark built?"]


pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(**options):
    """A tiny QFF component: 4 Q-Former layers, image cross-attention in layers 0 and 2 (as BLIP-2's every 2nd)."""
    torch.manual_seed(0)
    spec = {
        "kind": "blip2_qff",
        "tiny": True,
        "device": "cpu",
        "options": {"num_layers": 4, "cross_attention_frequency": 2, "vocab_texts": SECTIONS + QUESTIONS, **options},
    }
    settings = {k: spec["options"].pop(k) for k in list(spec["options"]) if k in QFFConfig.__dataclass_fields__}
    return build_qff_component(spec, settings)


def inputs(comp, n_images=2, seed=1):
    """Padded section tokens, question tokens and ViT states for random images."""
    g = torch.Generator().manual_seed(seed)
    size = comp.model.image_size
    images = comp.model.encode_image(torch.randn(n_images, 3, size, size, generator=g))
    return comp.tokenize_sections(SECTIONS), comp.tokenize_questions(QUESTIONS), images


def stock_itm(base, input_ids, attention_mask, image_states, **kwargs):
    """The stock Q-Former's queries + text + image pass (models.md §1.2, ITM row)."""
    q = base.query_tokens.shape[1]
    embeds = base.embeddings(input_ids=input_ids, query_embeds=base.query_tokens.expand(input_ids.shape[0], -1, -1))
    mask = torch.cat([torch.ones(input_ids.shape[0], q, dtype=attention_mask.dtype), attention_mask], 1)
    return base.qformer(
        query_embeds=embeds,
        query_length=q,
        attention_mask=mask,
        encoder_hidden_states=image_states,
        encoder_attention_mask=torch.ones(image_states.shape[:-1], dtype=torch.long),
        **kwargs,
    )


@torch.no_grad()
def test_text_only_path_equals_stock_qformer():
    comp = tiny(attention="eager")
    sec, _, _ = inputs(comp)
    assert sec["attention_mask"].min() == 0, "the batch must be padded"
    base = comp.model.base
    stock = base.qformer(
        query_embeds=base.embeddings(input_ids=sec["input_ids"]), query_length=0, attention_mask=sec["attention_mask"]
    ).last_hidden_state
    ours = comp.model.encode_text(sec["input_ids"], sec["attention_mask"])
    assert (ours - stock).abs().max().item() == 0.0


@pytest.mark.slow
@torch.no_grad()
def test_question_pass_equals_stock_and_keeps_every_layer():
    comp = tiny(attention="eager")
    _, qs, images = inputs(comp)
    base, q = comp.model.base, comp.model.num_queries
    stock = stock_itm(base, qs["input_ids"], qs["attention_mask"], images, output_hidden_states=True)
    enc = comp.model.encode_question(qs["input_ids"], qs["attention_mask"], images)
    assert len(enc.layer_states) == comp.model.num_layers == len(stock.hidden_states) - 1
    for layer, states in enumerate(enc.layer_states):
        assert (states - stock.hidden_states[layer + 1][:, :q]).abs().max().item() == 0.0
    assert (enc.tokens - stock.last_hidden_state[:, :q]).abs().max().item() == 0.0


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("focus", ["per_layer", "input"])
def test_zero_gate_section_pass_equals_stock_exactly(focus):
    comp = tiny(focus=focus, attention="eager")
    sec, qs, images = inputs(comp)
    question = comp.model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
    image_index = torch.tensor([0, 0, 1])
    per_section = images[image_index]
    stock = stock_itm(comp.model.base, sec["input_ids"], sec["attention_mask"], per_section).last_hidden_state
    focused = comp.model.encode_sections(
        sec["input_ids"], sec["attention_mask"], images, question, image_index=image_index
    )
    generic = comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], per_section, focus="none")
    q = comp.model.num_queries
    assert (focused - stock[:, :q]).abs().max().item() == 0.0
    assert (generic - stock[:, :q]).abs().max().item() == 0.0


@pytest.mark.slow
@torch.no_grad()
def test_nonzero_gates_change_sections_and_focus_modes_differ():
    per_layer, by_input, generic = tiny(focus="per_layer"), tiny(focus="input"), tiny(focus="none")
    assert not hasattr(generic.model, "q_gate") and not hasattr(generic.model, "input_gate")
    per_layer.model.q_gate.fill_(0.5)
    by_input.model.input_gate.fill_(0.5)
    outs = {}
    for name, comp in [("per_layer", per_layer), ("input", by_input), ("none", generic)]:
        sec, qs, images = inputs(comp)
        question = comp.model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
        outs[name] = comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], question)
        assert outs[name].shape == (3, comp.model.num_queries, comp.model.hidden_size)
        assert torch.isfinite(outs[name]).all()
    assert not torch.allclose(outs["per_layer"], outs["none"])
    assert not torch.allclose(outs["input"], outs["none"])
    assert not torch.allclose(outs["per_layer"], outs["input"])


@torch.no_grad()
def test_section_encoding_depends_on_the_question_only_when_focused():
    comp = tiny()
    comp.model.q_gate.fill_(1.0)
    sec, qs, images = inputs(comp)
    questions = comp.model.encode_question(qs["input_ids"], qs["attention_mask"], images)
    focused = [
        comp.model.encode_sections(
            sec["input_ids"], sec["attention_mask"], images[:1], questions, question_index=torch.full((3,), i)
        )
        for i in range(2)
    ]
    assert not torch.allclose(focused[0], focused[1])
    generic = [
        comp.model.encode_sections(
            sec["input_ids"],
            sec["attention_mask"],
            images[:1],
            questions,
            question_index=torch.full((3,), i),
            focus="none",
        )
        for i in range(2)
    ]
    assert torch.equal(generic[0], generic[1])


@torch.no_grad()
def test_broadcast_and_index_layouts_agree():
    comp = tiny()
    comp.model.q_gate.fill_(0.7)
    sec, qs, images = inputs(comp, n_images=2)
    questions = comp.model.encode_question(qs["input_ids"], qs["attention_mask"], images)
    first = comp.model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
    ids, mask = sec["input_ids"], sec["attention_mask"]
    # one question for all sections: broadcast view vs explicit copies vs an index into two questions
    broadcast = comp.model.encode_sections(ids, mask, images[:1], first)
    copied = type(first)(tuple(s.repeat(3, 1, 1) for s in first.layer_states))
    explicit = comp.model.encode_sections(ids, mask, images[0:1].repeat(3, 1, 1), copied)
    indexed = comp.model.encode_sections(
        ids,
        mask,
        images,
        questions,
        image_index=torch.zeros(3, dtype=torch.long),
        question_index=torch.zeros(3, dtype=torch.long),
    )
    torch.testing.assert_close(broadcast, explicit, rtol=0, atol=1e-6)
    torch.testing.assert_close(indexed, explicit, rtol=0, atol=1e-6)
    # per-article images: each section gets its own article's states
    mixed = comp.model.encode_sections(ids, mask, images, first, image_index=torch.tensor([1, 0, 1]))
    alone = comp.model.encode_sections(ids[1:2], mask[1:2], images[0:1], first)
    torch.testing.assert_close(mixed[1:2], alone, rtol=0, atol=1e-5)
    assert not torch.allclose(mixed[0:1], comp.model.encode_sections(ids[0:1], mask[0:1], images[0:1], first))


def test_gate_gets_gradient_at_init_and_vit_stays_frozen():
    comp = tiny()
    model = comp.model
    sec, qs, _ = inputs(comp)
    size = model.image_size
    images = model.encode_image(torch.randn(2, 3, size, size))
    assert not images.requires_grad
    question = model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
    states = model.encode_sections(
        sec["input_ids"], sec["attention_mask"], images, question, image_index=torch.tensor([0, 0, 1])
    )
    logits = late_interaction(question.tokens, states) / 0.07
    torch.nn.functional.cross_entropy(logits[None], torch.tensor([0])).backward()
    assert model.q_gate.grad is not None and (model.q_gate.grad != 0).all()
    # tanh gating: the warm-started blocks learn once the gate has moved (Flamingo scheme)
    assert all(p.grad is None or (p.grad == 0).all() for p in model.q_xattn.parameters())
    assert model.base.query_tokens.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.base.vision_model.parameters())


def test_new_blocks_are_warm_started_from_self_attention():
    model = tiny().model
    for block, layer in zip(model.q_xattn, model.base.qformer.encoder.layer):
        for (name, ours), (_, theirs) in zip(block.state_dict().items(), layer.attention.state_dict().items()):
            assert torch.equal(ours, theirs), name
            assert ours.data_ptr() != theirs.data_ptr(), "warm start must copy, not share"
    assert torch.equal(model.q_gate, torch.zeros(model.num_layers))


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_gradients():
    comp = tiny()
    model = comp.model.train()
    model.q_gate.data.fill_(0.3)
    sec, qs, images = inputs(comp)
    grads = []
    for enabled in (False, True):
        model.gradient_checkpointing = enabled
        model.zero_grad()
        torch.manual_seed(3)
        question = model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
        states = model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], question)
        late_interaction(question.tokens, states).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and "q_gate" in grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


def test_frozen_vit_stays_in_eval_mode():
    model = tiny().model.train()
    assert model.training and model.base.qformer.training
    assert not model.base.vision_model.training


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_keeps_qformer_and_new_blocks_fp32(dtype):
    comp = build_component(
        {
            "kind": "blip2_qff",
            "tiny": True,
            "device": "cpu",
            "dtype": dtype,
            "options": {"num_layers": 2, "vocab_texts": SECTIONS},
        }
    )
    model = comp.model
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    assert model.vision_dtype == half
    assert model.qformer_dtype == torch.float32 and model.base.query_tokens.dtype == torch.float32
    # fp32 master weights for everything that trains (the text embeddings too), half only for the frozen ViT
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}
    assert model.base.embeddings.word_embeddings.weight.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.q_xattn.parameters()) and model.q_gate.dtype == torch.float32
    with torch.no_grad():
        sec, qs, images = inputs(comp)
        question = model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
        out = model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], question)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_wrong_calls_are_refused():
    comp = tiny()
    sec, qs, images = inputs(comp)
    with torch.no_grad():
        questions = comp.model.encode_question(qs["input_ids"], qs["attention_mask"], images)
        with pytest.raises(ValueError, match="needs the question"):
            comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1])
        with pytest.raises(ConfigError, match="built with focus='per_layer'"):
            comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], questions, focus="input")
        with pytest.raises(ValueError, match="pass question_index"):
            comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], questions)
        with pytest.raises(ValueError, match="pass image_index"):
            comp.model.encode_sections(
                sec["input_ids"],
                sec["attention_mask"],
                images,
                questions,
                question_index=torch.zeros(3, dtype=torch.long),
            )
    with pytest.raises(ConfigError, match="focus"):
        QFFModel(copy.deepcopy(comp.model.base), focus="per-layer")


def test_one_bf16_mixed_step_at_the_paper_lr_changes_every_trainable_tensor():
    """fp32 master weights: a bf16 weight cannot take a step of lr 1e-5 (its update rounds away)."""
    from qkvqa.models.qff_module import freeze_outside_objective

    comp = build_component(
        {
            "kind": "blip2_qff",
            "tiny": True,
            "device": "cpu",
            "dtype": "bf16",
            "options": {"num_layers": 4, "cross_attention_frequency": 2, "vocab_texts": SECTIONS + QUESTIONS},
        }
    )
    model = comp.model.train()
    freeze_outside_objective(model)
    model.q_gate.data.fill_(0.3)  # so the focus blocks are on the loss's path at step 0
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert "base.embeddings.word_embeddings.weight" in trainable
    before = {n: p.detach().clone() for n, p in trainable.items()}
    optimizer = torch.optim.AdamW(trainable.values(), lr=1e-5, betas=(0.9, 0.98), eps=1e-7, weight_decay=0.05)
    sec, qs, images = inputs(comp)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what precision="bf16-mixed" runs
        question = model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
        states = model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], question)
        logits = late_interaction(question.tokens, states) / 0.07
    torch.nn.functional.cross_entropy(logits.float()[None], torch.tensor([0])).backward()
    optimizer.step()
    # Adam's first step moves an element by about lr wherever its gradient is not tiny: every such element
    # must move (with bf16 weights, only those near zero would)
    stuck = {}
    for name, param in trainable.items():
        pushed = param.grad.abs() > 1e-6 if param.grad is not None else torch.zeros_like(param, dtype=torch.bool)
        moved = param.detach() != before[name]
        if (pushed & ~moved).any():  # (a key bias gets no gradient at all: softmax ignores it)
            stuck[name] = f"{int((pushed & ~moved).sum())} of {int(pushed.sum())} pushed elements stayed"
    assert not stuck, f"{len(stuck)} trainable tensors did not take the step: {dict(list(stuck.items())[:4])}"
    assert (trainable["base.embeddings.word_embeddings.weight"].grad.abs() > 1e-6).any()
    assert (trainable["q_xattn.0.attention.query.weight"].grad.abs() > 1e-6).any()


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"gate": "none"}, {"gate": "tanh", "gate_init": 0.5}])
def test_an_open_or_absent_gate_gives_the_focus_blocks_gradient_at_step_0(options, tmp_path):
    comp = tiny(**options)
    model = comp.model
    sec, qs, images = inputs(comp)
    question = model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
    states = model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], question)
    late_interaction(question.tokens, states).sum().backward()
    blocks, gates = model.focus_parameters()
    assert sum(p.grad.abs().sum().item() for p in blocks if p.grad is not None) > 0
    assert (len(gates) == 1) == (options["gate"] == "tanh")
    if options["gate"] == "none":  # no gate: the block's output replaces the queries from step 0
        assert model.gate_values() is None and not hasattr(model, "q_gate")
        reloaded = QFFModel.from_checkpoint(model.save_pretrained(tmp_path / "qff"))
        assert reloaded.gate == "none" and not hasattr(reloaded, "q_gate")
    else:
        assert torch.allclose(model.gate_values(), torch.tanh(torch.tensor(0.5)))


def test_a_closed_tanh_gate_blocks_the_focus_path_unlike_an_absent_one():
    closed, plain = tiny(), tiny(gate="none")
    with torch.no_grad():
        outs = []
        for comp in (closed, plain):
            sec, qs, images = inputs(comp)
            question = comp.model.encode_question(qs["input_ids"][:1], qs["attention_mask"][:1], images[:1])
            focused = comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], question)
            generic = comp.model.encode_sections(sec["input_ids"], sec["attention_mask"], images[:1], focus="none")
            outs.append((focused - generic).abs().max().item())
    assert outs[0] == 0.0 and outs[1] > 1e-3
