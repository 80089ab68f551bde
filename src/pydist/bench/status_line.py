"""The progress line on stderr: rewritten in place on a terminal, plain lines otherwise."""
from __future__ import annotations

import sys
from typing import TextIO


class StatusLine:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.shown = False

    def update(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the in-place line (terminal only) so the next output starts clean."""
        if self.tty and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self.shown = False
