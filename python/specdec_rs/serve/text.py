"""Token ids to streamed text, with stop strings.

`TextAssembler` decodes a request's output incrementally: the new ids
are decoded together with a few before them (the window since the last
text it was sure of), and the text they add is appended once it no longer
ends inside a character (U+FFFD), so each round costs the window, not the
whole output, and the text is `tokenizer.decode(ids)` for byte-level BPE
tokenizers. It hands out the new text, holding back a tail that could
still turn into a stop string. A stop string ends the text before it; the
tokens counted are those up to the one that completed it.

Stops are found by one Knuth–Morris–Pratt automaton per stop string
(`StopScan`), fed each new character once: its state is the longest suffix
of the text that is a prefix of that stop, so a round costs O(new
characters × stops) and the hold-back is the largest state, whatever the
stops' lengths (at most `MAX_STOP_CHARS` each, `MAX_STOPS` a request).

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

MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 4096  # characters per stop string


def failure_table(stop: str) -> list[int]:
    """KMP's table: fail[i] = the longest proper border of stop[: i + 1]."""
    fail = [0] * len(stop)
    j = 0
    for i in range(1, len(stop)):
        while j and stop[i] != stop[j]:
            j = fail[j - 1]
        if stop[i] == stop[j]:
            j += 1
        fail[i] = j
    return fail


class StopScan:
    """The stop strings' automata over one growing text. `feed(text, at)`
    takes the characters appended at index `at` and returns the earliest
    stop they complete, as (start index, stop), or None; `hold` is the
    longest suffix of the text fed that is a prefix of some stop."""

    def __init__(self, stops: list[str]):
        self.stops = list(dict.fromkeys(s for s in stops if s))
        self.fails = [failure_table(s) for s in self.stops]
        self.states = [0] * len(self.stops)

    def feed(self, chunk: str, at: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for i, (stop, fail) in enumerate(zip(self.stops, self.fails, strict=True)):
            j, n = self.states[i], len(stop)
            for offset, ch in enumerate(chunk):
                while j and ch != stop[j]:
                    j = fail[j - 1]
                if ch == stop[j]:
                    j += 1
                if j == n:  # this stop's first match in the chunk (later ones start later)
                    start = at + offset + 1 - n
                    if best is None or (start, n) < (best[0], len(best[1])):
                        best = (start, stop)
                    j = fail[j - 1]
                    break
            self.states[i] = j
        return best

    @property
    def hold(self) -> int:
        return max(self.states, default=0)


class TextAssembler:
    """One request's text: `feed(ids)` returns the text safe to send now;
    `finish()` the rest; `stopped` tells whether a stop string ended it, and
    `tokens` how many ids the text used."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        self.tokenizer = tokenizer
        self.scan = StopScan(stops)
        self.stops = self.scan.stops
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

    def _advance(self, force: bool) -> str:
        """Grow the text, scan what it gained for stops, hand out what is safe."""
        window = (self.prefix, self.read, len(self.text))  # the text's known end
        self._grow(force)
        found = self.scan.feed(self.text[window[2] :], window[2])
        if found is not None:
            at, stop = found
            self.stopped = True
            self.tokens = self._tokens_through(window, at + len(stop))
            self.text = self.text[:at]
            return self._hand_out(len(self.text))
        self.tokens = len(self.ids)
        return self._hand_out(len(self.text) if force else len(self.text) - self.scan.hold)

    def feed(self, ids: list[int]) -> str:
        if self.stopped or not ids:
            return ""
        self.ids += ids
        return self._advance(force=False)

    def finish(self) -> str:
        """The text not handed out yet (the output ended): what the last ids
        add is forced out (an unfinished character as U+FFFD), and still
        scanned for stops."""
        if self.stopped:
            return self._hand_out(len(self.text))
        return self._advance(force=True)

    def _hand_out(self, upto: int) -> str:
        upto = max(upto, self.sent)
        out, self.sent = self.text[self.sent : upto], upto
        return out

    def _tokens_through(self, window: tuple[int, int, int], chars: int) -> int:
        """The fewest ids whose text reaches `chars` characters; `window` =
        (prefix, read, text length) before the ids since `read` were added
        to the text (any of them, even one held back from an earlier feed,
        may be the one that completed the stop)."""
        prefix, read, length = window
        known = len(self._decode(self.ids[prefix:read]))
        for j in range(read + 1, len(self.ids)):
            text = self._decode(self.ids[prefix:j])
            if length + len(text) - known >= chars and not text.endswith("\ufffd"):
                return j
        return len(self.ids)
