"""The changes an output makes to the prompt it copies, learned from their alignment and replayed on lookup paths.

An editing request ("rename `total` to `running_sum`, keep the rest") copies its prompt with the
same small change again and again. A path copied from the prompt proposes the old text at every
such place and is rejected there. Aligning the output with the prompt (difflib) shows each
finished change as a replacement between matching stretches: prompt tokens `removed` became output
tokens `inserted`. Lookup then reads the context's tail in the prompt's words (inserted → removed),
finds where the copy stands in the prompt, and replays the changes on the path it copies
(removed → inserted), the latest change winning where the same text was changed twice.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

MIN_ANCHOR = 2  # matching tokens on each side of a replacement for it to count as a change
MAX_REMOVED, MAX_INSERTED = 8, 16  # longer replacements are rewrites, not changes that repeat
# An alignment runs on the event loop, in pure Python. The prompt is indexed once a request (difflib's index of
# its second sequence) and each round aligns only the output's new tokens and the LOOKBACK before them (a change
# they finish began within them), so a round's work does not grow with the output; at most MAX_ALIGNED_OUTPUT
# tokens at once (one call with a whole output: the latest ones).
MAX_ALIGNED_OUTPUT = 2048
LOOKBACK = 4 * (2 * MIN_ANCHOR + MAX_INSERTED)


@dataclass(frozen=True)
class Edit:
    """Prompt tokens the output replaced, and what it wrote instead."""

    removed: tuple[int, ...]
    inserted: tuple[int, ...]


Replacements = dict[tuple[int, ...], tuple[int, ...]]  # removed -> inserted


def learn_edits(prompt: Sequence[int], output: Sequence[int]) -> list[Edit]:
    """The output's finished replacements of prompt text (one per removed text, the latest), longest removed first,
    from one alignment of its latest MAX_ALIGNED_OUTPUT tokens."""
    return OutputEdits(prompt).learn(output)


class OutputEdits:
    """One request's changes to its prompt, learned as its output grows: each call aligns only the tokens written
    since the last one (and the LOOKBACK before them). An output that does not extend the last one (a
    draft-ahead's guess that was not kept) goes on from the call before."""

    def __init__(self, prompt: Sequence[int]) -> None:
        self._prompt = list(prompt)
        self._matcher: difflib.SequenceMatcher | None = None  # the prompt's index, made at the first alignment
        self._last = _Learned((), {})
        self._before = self._last  # what the call before the last one knew

    def learn(self, output: Sequence[int]) -> list[Edit]:
        """The changes of the output so far."""
        if not _extends(output, self._last.output):
            self._last = self._before if _extends(output, self._before.output) else _Learned((), {})
        if len(output) > len(self._last.output):
            start = max(len(self._last.output) - LOOKBACK, len(output) - MAX_ALIGNED_OUTPUT, 0)
            latest = {**self._last.latest, **self._replacements(output[start:])}  # a later change wins
            self._before, self._last = self._last, _Learned(tuple(output), latest)
        return self._last.edits

    def _replacements(self, output: Sequence[int]) -> Replacements:
        """The finished replacements in one alignment of `output` with the prompt, the latest of each removed text."""
        if self._matcher is None:
            # difflib's junk heuristic (tokens frequent in a long prompt, such as indentation, only extend a
            # match) keeps an alignment to milliseconds for thousands of tokens.
            self._matcher = difflib.SequenceMatcher(None, b=self._prompt)
        self._matcher.set_seq1(list(output))
        opcodes = self._matcher.get_opcodes()
        latest: Replacements = {}
        for before, (tag, o0, o1, p0, p1), after in zip(opcodes, opcodes[1:], opcodes[2:]):
            anchored = (before[0] == after[0] == "equal" and before[2] - before[1] >= MIN_ANCHOR
                        and after[2] - after[1] >= MIN_ANCHOR)
            if tag == "replace" and anchored and p1 - p0 <= MAX_REMOVED and o1 - o0 <= MAX_INSERTED:
                latest[tuple(self._prompt[p0:p1])] = tuple(output[o0:o1])
        return latest


@dataclass(frozen=True)
class _Learned:
    """An output and the changes it made (one per removed text, the latest)."""

    output: tuple[int, ...]
    latest: Replacements

    @property
    def edits(self) -> list[Edit]:
        """Longest removed text first."""
        return sorted((Edit(removed, inserted) for removed, inserted in self.latest.items()),
                      key=lambda e: -len(e.removed))


def _extends(output: Sequence[int], known: tuple[int, ...]) -> bool:
    return len(output) >= len(known) and tuple(output[:len(known)]) == known


def _replace_all(tokens: Sequence[int], pairs: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]
                 ) -> tuple[list[int], list[int]]:
    """Tokens with each occurrence of a pair's first part replaced by its second (left to right, first pair
    first), and for each token written, the position of the token it came from."""
    out: list[int] = []
    origins: list[int] = []
    at = 0
    while at < len(tokens):
        for old, new in pairs:
            if old and tuple(tokens[at:at + len(old)]) == old:
                out += new
                origins += [at] * len(new)
                at += len(old)
                break
        else:
            out.append(tokens[at])
            origins.append(at)
            at += 1
    return out, origins


def in_prompt_words(tail: Sequence[int], edits: Sequence[Edit]) -> tuple[list[int], tuple[int, ...]]:
    """The tail with the output's changes read back as the prompt had them, and the rest of a change the tail
    stops inside (written before anything copied)."""
    undo = sorted(((e.inserted, e.removed) for e in edits), key=lambda pair: -len(pair[0]))
    for edit in sorted(edits, key=lambda e: -len(e.inserted)):
        for written in range(len(edit.inserted) - 1, 0, -1):
            if tuple(tail[-written:]) == edit.inserted[:written]:
                return _replace_all(tail[:-written], undo)[0] + list(edit.removed), edit.inserted[written:]
    return _replace_all(tail, undo)[0], ()


def replay(path: Sequence[int], edits: Sequence[Edit]) -> tuple[list[int], list[int]]:
    """A path copied from the prompt with the output's changes made to it, and where each token came from."""
    return _replace_all(path, [(e.removed, e.inserted) for e in edits])
