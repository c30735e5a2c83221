"""Issue 44 class 2: a `llama3` generator whose tokenizer lacks Llama 3's special tokens rendered the chat markers as
plain text (193 prompt tokens against 73) with an INFO line only; refused in one line naming the key and the fix."""

from __future__ import annotations

import pytest

from qkvqa.errors import ConfigError
from qkvqa.generation.backends import Llama3Format
from qkvqa.generation.tiny import write_tiny_chatml_lm, write_tiny_llama3


def test_a_tokenizer_without_llama3_special_tokens_is_refused_for_kind_llama3(tmp_path):
    from transformers import AutoTokenizer

    chatml = AutoTokenizer.from_pretrained(str(write_tiny_chatml_lm(tmp_path / "lm")), local_files_only=True)
    chatml.chat_template = None
    with pytest.raises(ConfigError, match=r"^components.generator: kind llama3, .* lacks Llama 3's special tokens"):
        Llama3Format(chatml)
    llama = AutoTokenizer.from_pretrained(str(write_tiny_llama3(tmp_path / "llama")), local_files_only=True)
    llama.chat_template = None
    Llama3Format(llama)  # Llama 3's own tokens: the Llama 3 format, as before
