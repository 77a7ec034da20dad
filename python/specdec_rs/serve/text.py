"""Token ids to streamed text, with stop strings.

`TextAssembler` decodes a request's output incrementally: the new ids
are decoded together with a few before them (the window since the last
text it was sure of), and the text they add is appended once it no longer
ends inside a character (U+FFFD), so each round costs the window, not the
whole output, and the text is `tokenizer.decode(ids)` for byte-level BPE
tokenizers. It hands out the new text, holding back a tail that could
still turn into a stop string. A stop string ends the text before it; the
tokens counted are those up to the one that completed it.

>>> class Chars:  # a tokenizer whose token i is chr(i)
...     def decode(self, ids, skip_special_tokens=True):
...         return "".join(map(chr, ids))
>>> a = TextAssembler(Chars(), ["END"])
>>> a.feed([ord(c) for c in "abcE"])
'abc'
>>> a.feed([ord(c) for c in "NDxyz"]), a.stopped, a.tokens
('', True, 6)
"""

from __future__ import annotations

from typing import Any


class TextAssembler:
    """One request's text: `feed(ids)` returns the text safe to send now;
    `finish()` the rest; `stopped` tells whether a stop string ended it, and
    `tokens` how many ids the text used."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, [s for s in stops if s]
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters handed out
        self.stopped = False
        self.tokens = 0
        self.prefix = self.read = 0  # ids[prefix:read] decode to the text's known end

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _grow(self, force: bool = False) -> None:
        """Append the text ids[read:] add (unless it ends inside a character)."""
        known = self._decode(self.ids[self.prefix : self.read])
        now = self._decode(self.ids[self.prefix :])
        if len(now) > len(known) and (force or not now.endswith("\ufffd")):
            self.text += now[len(known) :]
            self.prefix, self.read = self.read, len(self.ids)

    def feed(self, ids: list[int]) -> str:
        if self.stopped or not ids:
            return ""
        window = (self.prefix, self.read, len(self.text))  # the text's known end
        start = len(self.ids)
        self.ids += ids
        self._grow()
        cut = self._first_stop()
        if cut is not None:
            at, stop = cut
            self.stopped = True
            self.tokens = self._tokens_through(start, window, at + len(stop))
            self.text = self.text[:at]
            return self._hand_out(len(self.text))
        self.tokens = len(self.ids)
        return self._hand_out(len(self.text) - self._held_back())

    def finish(self) -> str:
        """The text not handed out yet (the output ended without a stop string)."""
        if not self.stopped:
            self._grow(force=True)
        return self._hand_out(len(self.text))

    def _hand_out(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out, self.sent = self.text[self.sent : upto], upto
        return out

    def _first_stop(self) -> tuple[int, str] | None:
        longest = max((len(s) for s in self.stops), default=0)
        begin = max(0, self.sent - longest)
        found = [(i, s) for s in self.stops if (i := self.text.find(s, begin)) >= 0]
        return min(found) if found else None

    def _held_back(self) -> int:
        """Characters at the end that may still become a stop string."""
        text, hold = self.text, 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        return hold

    def _tokens_through(self, start: int, window: tuple[int, int, int], chars: int) -> int:
        """The fewest ids (more than `start`) whose text reaches `chars`
        characters; `window` = (prefix, read, text length) before they came."""
        prefix, read, length = window
        known = len(self._decode(self.ids[prefix:read]))
        for j in range(start + 1, len(self.ids)):
            text = self._decode(self.ids[prefix:j])
            if length + len(text) - known >= chars and not text.endswith("\ufffd"):
                return j
        return len(self.ids)
