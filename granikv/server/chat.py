"""Chat messages -> prompt token ids.

With a local Hugging Face tokenizer that has a chat template (`--model-path`), the prompt is
that template's rendering with the generation prompt appended (`apply_chat_template(...,
add_generation_prompt=True)`), encoded without extra special tokens (the template writes its
own BOS). Otherwise the documented plain template, one block per message and an open
assistant block:

    <|system|>\n{content}\n<|user|>\n{content}\n<|assistant|>\n

Message content is a string or OpenAI's list of parts; only text parts are accepted (this
server has no image or audio input, so such parts are a 400, never dropped silently).
"""

from __future__ import annotations

from granikv.server.errors import BadRequest
from granikv.server.text import TextCodec

ROLES = ("system", "developer", "user", "assistant", "tool")


def plain_template(messages: list[dict]) -> str:
    """The fallback template (see the module docstring)."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def _content(c, i: int) -> str:
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for part in c:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"messages[{i}].content: only text parts are supported, got {kind!r}",
                                 "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")


def check_messages(messages) -> list[dict]:
    """The messages as plain {"role", "content": str} dicts, checked."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", "messages")
        if m.get("tool_calls"):
            raise BadRequest(f"messages[{i}].tool_calls: tools are not supported", "messages")
        out.append({"role": role, "content": _content(m.get("content"), i)})
    return out


def chat_prompt(messages, codec: TextCodec, encode=None) -> tuple[list[int], str]:
    """(prompt ids, prompt text) of a chat request; `encode` (default: the codec's) tokenizes the
    rendered text (the server passes its checked `RequestValidator.encode_text`)."""
    msgs = check_messages(messages)
    if codec.chat_template:
        try:
            text = codec.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - a template that refuses the messages (e.g. role order)
            raise BadRequest(f"the model's chat template refused the messages: {e}", "messages") from None
    else:
        text = plain_template(msgs)
    return (encode or codec.encode)(text), text
