"""Stop strings on streamed text (detok.py) and the chat prompt (chat.py): a local Hugging Face
tokenizer's own chat template, or the documented plain template."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from granikv.server.chat import chat_prompt, plain_template
from granikv.server.detok import ChoiceText
from granikv.server.errors import BadRequest
from granikv.server.text import TextCodec


class _Pieces(TextCodec):
    """A codec whose ids are characters of a fixed alphabet (piecewise, like the id codec)."""

    ALPHA = "ab c\ufffd"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.ALPHA[i] for i in ids)


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 3), max_size=30), stops=st.lists(st.text("ab c", min_size=1, max_size=4),
                                                                    max_size=3),
       cuts=st.lists(st.integers(1, 4), max_size=30))
def test_streamed_text_equals_the_whole_text_cut_at_the_first_stop(ids, stops, cuts):
    codec = _Pieces()
    whole = codec.decode(ids)
    hits = [whole.find(s) for s in stops if whole.find(s) >= 0]
    expect = whole[:min(hits)] if hits else whole
    t = ChoiceText(codec, tuple(stops))
    out, i = "", 0
    for k in cuts + [len(ids)]:
        t.add(ids[i:i + k])
        i += k
        piece = t.delta(final=False)
        out += piece
        # nothing streamed is ever taken back by a later stop string
        assert expect.startswith(out)
    out += t.delta(final=True)
    assert out == expect and t.stopped == bool(hits)


def test_incomplete_characters_wait_for_the_next_token():
    t = ChoiceText(_Pieces())
    t.add([0, 4])  # "a" + an incomplete UTF-8 sequence
    assert t.delta(final=False) == "a"
    assert t.delta(final=True) == "\ufffd"


def test_plain_template_and_text_parts():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    ids, text = chat_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": parts}], TextCodec())
    assert text == "<|system|>\nS\n<|user|>\nab\n<|assistant|>\n" == plain_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "ab"}])
    assert ids == list(text.encode())
    with pytest.raises(BadRequest, match="image_url"):
        chat_prompt([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], TextCodec())
    with pytest.raises(BadRequest, match="messages"):
        chat_prompt([], TextCodec())


def test_a_local_tokenizers_chat_template_is_used(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[UNK]", "[user]", "[assistant]", "[system]", "hi", "there", "be", "nice"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}[assistant]{% endif %}")
    fast.save_pretrained(tmp_path)
    codec = TextCodec(str(tmp_path))
    assert codec.chat_template
    ids, text = chat_prompt([{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi there"}],
                            codec)
    assert text == "[system] be nice [user] hi there [assistant]"
    assert ids == [3, 6, 7, 1, 4, 5, 2]
