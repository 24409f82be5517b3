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

import numpy as np

from proxy.drafting.suffix import MAX_MATCH, match_lengths

MIN_ANCHOR = 2  # matching tokens on each side of a replacement for it to count as a change
MAX_REMOVED, MAX_INSERTED = 8, 16  # longer replacements are rewrites, not changes that repeat
# The alignment runs every round, on the event loop, in pure Python, at a cost that grows with both lengths:
# the output's latest tokens are aligned with the stretch of the prompt they copy (with room for what they left
# out), which bounds a round's alignment (tens of milliseconds at most) however long the prompt and the output.
# A change the output made before them is forgotten; one that repeats is made again within them.
MAX_ALIGNED_OUTPUT = 2048
MAX_ALIGNED_PROMPT = 4 * MAX_ALIGNED_OUTPUT
PROBES = 4  # places in the aligned output whose match in a longer prompt says which stretch it copies


@dataclass(frozen=True)
class Edit:
    """Prompt tokens the output replaced, and what it wrote instead."""

    removed: tuple[int, ...]
    inserted: tuple[int, ...]


def learn_edits(prompt: Sequence[int], output: Sequence[int]) -> list[Edit]:
    """The output's finished replacements of prompt text (one per removed text, the latest), longest removed first."""
    output = output[-MAX_ALIGNED_OUTPUT:]
    prompt = _copied_stretch(prompt, output)
    # difflib's junk heuristic (tokens frequent in a long output, such as indentation, only extend a
    # match) keeps this to milliseconds for thousands of tokens, where an exhaustive alignment takes tenths.
    matcher = difflib.SequenceMatcher(None, list(prompt), list(output))
    opcodes = matcher.get_opcodes()
    latest: dict[tuple[int, ...], tuple[int, ...]] = {}
    for before, (tag, p0, p1, o0, o1), after in zip(opcodes, opcodes[1:], opcodes[2:]):
        anchored = (before[0] == after[0] == "equal" and before[2] - before[1] >= MIN_ANCHOR
                    and after[2] - after[1] >= MIN_ANCHOR)
        if tag == "replace" and anchored and p1 - p0 <= MAX_REMOVED and o1 - o0 <= MAX_INSERTED:
            latest[tuple(prompt[p0:p1])] = tuple(output[o0:o1])
    return sorted((Edit(removed, inserted) for removed, inserted in latest.items()), key=lambda e: -len(e.removed))


def _copied_stretch(prompt: Sequence[int], output: Sequence[int]) -> Sequence[int]:
    """The MAX_ALIGNED_PROMPT prompt tokens centred on the stretch the output copies (all of a shorter prompt)."""
    if len(prompt) <= MAX_ALIGNED_PROMPT:
        return prompt
    corpus = np.asarray(prompt, dtype=np.int64)
    longest, offset = 0, len(prompt) - len(output)  # prompt position minus output position (no match: the end)
    for end in sorted({len(output) * probe // PROBES for probe in range(1, PROBES + 1)} - {0}):
        ends, lengths = match_lengths(corpus, np.asarray(output[max(0, end - MAX_MATCH):end], dtype=np.int64),
                                      MAX_MATCH)
        if lengths.size and lengths.max() >= longest:  # the longest match wins, the latest among equals
            longest = int(lengths.max())
            offset = int(ends[np.flatnonzero(lengths == longest)[-1]]) - (end - 1)
    start = min(max(0, offset + len(output) // 2 - MAX_ALIGNED_PROMPT // 2), len(prompt) - MAX_ALIGNED_PROMPT)
    return prompt[start:start + MAX_ALIGNED_PROMPT]


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
