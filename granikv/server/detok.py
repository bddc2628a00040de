"""The text of one choice as its tokens arrive: detokenized, cut before the first stop string,
and, while streaming, held back at the end where it could still become a stop string.

Stop strings are matched on the decoded text, not on tokens: a stop string may span token
boundaries or end inside a token (the text is then cut mid-token, as vLLM and SGLang do).
A streamed chunk never carries text that a later stop string would have removed, so the
streamed and the non-streamed outputs are the same text (tests/server/test_detok_chat.py).
"""

from __future__ import annotations

from granikv.server.text import TextCodec


class ChoiceText:
    def __init__(self, codec: TextCodec, stops: tuple[str, ...] = (), skip_special_tokens: bool = True) -> None:
        self.codec = codec
        self.stops = stops
        self.skip = skip_special_tokens
        self.longest = max((len(s) for s in stops), default=0)
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters already handed out by `delta`
        self.scanned = 0  # text before this index holds no stop string
        self.stopped = False  # a stop string was found; the text ends before it

    def _decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids, skip_special_tokens=self.skip)

    def add(self, ids: list[int]) -> None:
        """Append generated tokens (no-op once stopped)."""
        if self.stopped or not ids:
            return
        self.ids.extend(ids)
        self.text = self.text + self._decode(ids) if self.codec.incremental else self._decode(self.ids)
        if self.stops:
            start = max(0, self.scanned - self.longest + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
            self.scanned = len(self.text)

    def _held(self) -> int:
        """Characters at the end that must wait: a proper prefix of a stop string, or an
        incomplete UTF-8 sequence of a byte-level tokenizer (decoded as U+FFFD)."""
        t = self.text
        hold = 0
        unsent = len(t) - self.sent  # text already handed out cannot be held back: look no further
        for s in self.stops:
            for k in range(min(len(s) - 1, unsent), hold, -1):
                if t.endswith(s[:k]):
                    hold = k
                    break
        while hold < len(t) and t[len(t) - hold - 1] == "\ufffd":
            hold += 1
        return hold

    def delta(self, final: bool) -> str:
        """The text not handed out yet; all of it when `final` or stopped."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._held()
        if end <= self.sent:
            return ""
        out = self.text[self.sent:end]
        self.sent = end
        return out
