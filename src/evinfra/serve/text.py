"""Output text assembly: incremental detokenisation and OpenAI `stop` strings.

While streaming, the tail that could still become a stop string is held back, so a
client never receives text past a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

from evinfra.serve.engine.tokenizer import ChatTokenizer


class TextStream:
    def __init__(self, tokenizer: ChatTokenizer, stop_strings: Sequence[str] = ()) -> None:
        self._decoder = tokenizer.stream()
        self._stops = [s for s in stop_strings if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self.text = ""
        self._emitted = 0
        self.token_ids: list[int] = []
        self.stopped = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; returns the text now safe to send. Once a stop string
        appears, the text ends before it, `stopped` is set and later tokens are ignored."""
        for token in token_ids:
            if self.stopped:
                break
            self.token_ids.append(token)
            self.text += self._decoder.push(token)
            cut = self._stop_at()
            if cut is not None:
                self.text = self.text[:cut]
                self.stopped = True
        safe = len(self.text) if self.stopped else max(self._emitted, len(self.text) - self._hold)
        delta = self.text[self._emitted : safe]
        self._emitted = safe
        return delta

    def _stop_at(self) -> int | None:
        found = [i for s in self._stops if (i := self.text.find(s)) >= 0]
        return min(found) if found else None

    def finish(self) -> str:
        """The text held back, at the end of the output."""
        delta = self.text[self._emitted :]
        self._emitted = len(self.text)
        return delta
