"""TextStream: token ids in, text deltas out — stop strings, UTF-8 boundaries, EOS, max_tokens.

Tokens are faked at the boundary TextStream already has: `token_bytes` maps a token id to the
bytes it renders to. Each case lists its rounds (one `push` per round) as byte pieces; the
helper gives every piece its own token id, so a piece is exactly one token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire.textstream import LENGTH, STOP, Delta, TextStream

EOS = -1  # the fake end-of-generation token; every other id indexes the pieces
Piece = bytes | int  # bytes for a token that renders to them, EOS for the end token


@dataclass(frozen=True)
class Run:
    """What a stream produced: the delta of every push (and of close(), when called)."""

    deltas: list[Delta]
    stream: TextStream

    @property
    def texts(self) -> list[str]:
        return [d.text for d in self.deltas]

    @property
    def joined(self) -> str:
        return "".join(self.texts)


def run(rounds: Sequence[Sequence[Piece]], *, stop: Sequence[str] = (), max_tokens: int | None = None,
        close: bool = False) -> Run:
    """Push each round as one batch of fresh token ids; optionally close() at the end."""
    table: dict[int, bytes] = {}
    batches: list[list[int]] = []
    for pieces in rounds:
        batch = []
        for piece in pieces:
            if piece == EOS:
                batch.append(EOS)
            else:
                assert isinstance(piece, bytes)
                table[len(table)] = piece
                batch.append(len(table) - 1)
        batches.append(batch)
    stream = TextStream(table.__getitem__, lambda token: token == EOS, stop=stop, max_tokens=max_tokens)
    deltas = [stream.push(batch) for batch in batches]
    if close:
        deltas.append(stream.close())
    return Run(deltas, stream)


# -- stop strings ---------------------------------------------------------------------------------

STOP_CASES = [
    # (name, rounds, stop strings, deltas per push, finish reason)
    ("stop spans two rounds", [[b"Hello ", b"wor"], [b"ld!"]], ["world"], ["Hello ", ""], STOP),
    ("stop split across tokens in one round", [[b"ab", b"c<", b"/s", b">tail"]], ["</s>"], ["abc"], STOP),
    ("stop split across three rounds", [[b"x <"], [b"/"], [b"s> y"]], ["</s>"], ["x ", "", ""], STOP),
    ("stop inside one token", [[b"one STOP two"]], ["STOP"], ["one "], STOP),
    ("stop at the very start", [[b"STOP"], [b"more"]], ["STOP"], ["", ""], STOP),
    ("earliest of several stops wins", [[b"one two three"]], ["three", "two"], ["one "], STOP),
    ("earliest stop wins across rounds", [[b"x EN"], [b"D y STOP"]], ["STOP", "END"], ["x ", ""], STOP),
    ("a stop held as a prefix, then not matched, is released", [[b"Hello wor"], [b"m"]], ["world"],
     ["Hello ", "worm"], None),
    ("a prefix held over several rounds, then released", [[b"a <"], [b"/"], [b"p>"]], ["</s>"],
     ["a ", "", "</p>"], None),
    ("overlapping prefixes: the held text restarts inside itself", [[b"aa"], [b"ab"]], ["aab"], ["", "a"], STOP),
    ("text after the stop in the same token is dropped", [[b"42}\n\nnext"]], ["}"], ["42"], STOP),
    ("empty stop strings are ignored", [[b"abc"]], ["", "zz"], ["abc"], None),
    ("no stops: everything goes out at once", [[b"a", b"b"], [b"c"]], [], ["ab", "c"], None),
]


@pytest.mark.parametrize("rounds, stop, deltas, finish",
                         [pytest.param(*case[1:], id=case[0]) for case in STOP_CASES])
def test_stop_strings(rounds: list[list[Piece]], stop: list[str], deltas: list[str], finish: str | None) -> None:
    result = run(rounds, stop=stop)
    assert result.texts == deltas
    assert result.stream.finish_reason == finish
    assert result.stream.text == result.joined
    if finish == STOP:  # nothing from the stop string on ever reached the client
        assert not any(s and s in result.joined for s in stop)


def test_finish_reason_is_reported_on_the_push_that_ends() -> None:
    result = run([[b"a"], [b"b END"], [b"c"]], stop=["END"])
    assert [d.finish_reason for d in result.deltas] == [None, STOP, STOP]
    assert result.texts == ["a", "b ", ""]


def test_stop_tokens_are_counted() -> None:
    """The token that completes the stop string counts; tokens after it do not."""
    result = run([[b"a", b"S", b"TOP", b"b", b"c"]], stop=["STOP"])
    assert result.joined == "a"
    assert result.stream.completion_tokens == 3


# -- UTF-8 ----------------------------------------------------------------------------------------

E_ACUTE, SHU, SMILE = "é".encode(), "数".encode(), "🙂".encode()  # 2, 3 and 4 bytes
assert (len(E_ACUTE), len(SHU), len(SMILE)) == (2, 3, 4)

UTF8_CASES = [
    # (name, pieces: one token each, pushed one per round, expected text)
    ("é split 1+1", [b"caf", E_ACUTE[:1], E_ACUTE[1:]], "café"),
    ("数 split 1+1+1", [SHU[:1], SHU[1:2], SHU[2:]], "数"),
    ("🙂 split 1+3", [SMILE[:1], SMILE[1:]], "🙂"),
    ("🙂 split 2+2", [SMILE[:2], SMILE[2:]], "🙂"),
    ("🙂 split 3+1 with text around", [b"a" + SMILE[:3], SMILE[3:] + b"b"], "a🙂b"),
    ("a token ends one character and starts the next",
     [b"caf" + E_ACUTE[:1], E_ACUTE[1:] + SHU[:2], SHU[2:] + SMILE[:1], SMILE[1:2], SMILE[2:]], "café数🙂"),
]


@pytest.mark.parametrize("pieces, text", [pytest.param(*case[1:], id=case[0]) for case in UTF8_CASES])
def test_multibyte_characters_split_across_tokens(pieces: list[bytes], text: str) -> None:
    result = run([[piece] for piece in pieces], close=True)
    assert result.joined == text
    for delta in result.texts:  # every delta is whole characters: no replacement, no half pair
        assert "\ufffd" not in delta
        delta.encode("utf-8")  # raises on a lone surrogate


@pytest.mark.parametrize("rounds", [
    pytest.param([[piece] for piece in [b"caf", E_ACUTE[:1], E_ACUTE[1:], b" ", SHU[:1], SHU[1:]]], id="per-token"),
    pytest.param([[b"caf", E_ACUTE[:1]], [E_ACUTE[1:], b" ", SHU[:1]], [SHU[1:]]], id="per-round"),
])
def test_multibyte_stop_string_split_across_tokens(rounds: list[list[bytes]]) -> None:
    result = run(rounds, stop=["数"])
    assert result.joined == "café "
    assert result.stream.finish_reason == STOP


def test_a_partial_character_is_not_emitted_before_it_completes() -> None:
    result = run([[b"x" + SMILE[:2]], [SMILE[2:3]], [SMILE[3:]]])
    assert result.texts == ["x", "", "🙂"]


# -- EOS, max_tokens, after the end, close() ------------------------------------------------------

END_CASES = [
    # (name, rounds, stop, max_tokens, close, deltas, finish, completion_tokens)
    ("EOS ends with stop and is counted", [[b"hi", EOS, b"after"]], [], None, False, ["hi"], STOP, 2),
    ("EOS alone", [[EOS]], [], None, False, [""], STOP, 1),
    ("EOS releases a held stop prefix", [[b"say hi", EOS]], ["hi!"], None, False, ["say hi"], STOP, 2),
    ("EOS in a later round", [[b"a"], [b"b", EOS], [b"c"]], [], None, False, ["a", "b", ""], STOP, 3),
    ("max_tokens gives length", [[b"a", b"b", b"c", b"d"]], [], 3, False, ["abc"], LENGTH, 3),
    ("max_tokens across rounds", [[b"a", b"b"], [b"c", b"d"]], [], 3, False, ["ab", "c"], LENGTH, 3),
    ("max_tokens flushes held text", [[b"x", b"EN"]], ["END"], 2, False, ["xEN"], LENGTH, 2),
    ("max_tokens flushes text held over rounds", [[b"x", b"EN"], [b"!"]], ["END", "EN?"], 3, False,
     ["x", "EN!"], LENGTH, 3),
    ("a stop in the last allowed token is a stop", [[b"a", b"b"]], ["b"], 2, False, ["a"], STOP, 2),
    ("EOS as the last allowed token is a stop", [[b"a", EOS]], [], 2, False, ["a"], STOP, 2),
    ("tokens after a stop are ignored", [[b"a.", b"b"], [b"c", EOS]], ["."], None, False, ["a", ""], STOP, 1),
    ("tokens after length are ignored", [[b"a"], [b"b", b"c"]], [], 1, False, ["a", ""], LENGTH, 1),
    ("close flushes a held stop prefix", [[b"abc wo"]], ["world"], None, True, ["abc ", "wo"], LENGTH, 1),
    ("close with nothing pushed", [], [], None, True, [""], LENGTH, 0),
    ("close after a stop changes nothing", [[b"a.b"]], ["."], None, True, ["a", ""], STOP, 1),
    ("close after EOS changes nothing", [[b"a", EOS]], [], None, True, ["a", ""], STOP, 2),
]


@pytest.mark.parametrize("rounds, stop, max_tokens, close, deltas, finish, completion_tokens",
                         [pytest.param(*case[1:], id=case[0]) for case in END_CASES])
def test_end_of_generation(rounds: list[list[Piece]], stop: list[str], max_tokens: int | None, close: bool,
                           deltas: list[str], finish: str, completion_tokens: int) -> None:
    result = run(rounds, stop=stop, max_tokens=max_tokens, close=close)
    assert result.texts == deltas
    assert result.deltas[-1].finish_reason == finish
    assert result.stream.finish_reason == finish
    assert result.stream.completion_tokens == completion_tokens
    assert result.stream.text == result.joined


def test_pushing_after_the_end_changes_nothing() -> None:
    result = run([[b"ab", EOS]])
    stream = result.stream
    before = (stream.text, stream.completion_tokens, stream.finish_reason)
    for _ in range(3):
        assert stream.push([0, EOS, 0]) == Delta("", STOP)
    assert stream.close() == Delta("", STOP)
    assert (stream.text, stream.completion_tokens, stream.finish_reason) == before


def test_close_flushes_an_incomplete_character_without_losing_text() -> None:
    """Upstream ended mid-character: the text before it is kept, the broken tail is at most one U+FFFD."""
    result = run([[b"ok" + SMILE[:2]]], close=True)
    assert result.joined in ("ok", "ok\ufffd")
    assert result.stream.finish_reason == LENGTH


# -- property: any byte split, any rounds, any stops ----------------------------------------------


def _expected(text: str, stops: list[str]) -> str:
    """The text up to the earliest stop occurrence, or all of it."""
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return text[: min(hits)] if hits else text


@st.composite
def split_case(draw: st.DrawFn) -> tuple[str, list[list[bytes]], list[str]]:
    """A text, its UTF-8 bytes cut at random points and grouped into random rounds, and stop strings."""
    text = draw(st.text(alphabet=st.sampled_from("ab c.\né数🙂</>"), max_size=40) | st.text(max_size=30))
    data = text.encode("utf-8")
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    bounds = [0, *[c for c in cuts if 0 < c < len(data)], len(data)]
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    groups = sorted(draw(st.sets(st.integers(1, max(1, len(pieces) - 1)), max_size=len(pieces))))
    group_bounds = [0, *[g for g in groups if 0 < g < len(pieces)], len(pieces)]
    rounds = [pieces[a:b] for a, b in zip(group_bounds, group_bounds[1:]) if b > a]
    # Stops: substrings of the text (so they do occur) or free text (so they mostly do not).
    substring = st.builds(lambda i, n: text[i : i + n], st.integers(0, max(0, len(text) - 1)), st.integers(1, 5))
    stops = draw(st.lists(substring | st.text(alphabet=st.sampled_from("ab.é数🙂</>"), min_size=1, max_size=4),
                          max_size=4))
    stops = [s for s in dict.fromkeys(stops) if s]
    # A stop that contains another is ambiguous under tokenization (which one completes first
    # depends on the token boundaries), so each case keeps only stops that contain no other.
    stops = [s for s in stops if not any(o != s and o in s for o in stops)]
    return text, rounds, stops


@settings(max_examples=400, deadline=None)
@given(split_case())
def test_deltas_are_the_text_up_to_the_first_stop(case: tuple[str, list[list[bytes]], list[str]]) -> None:
    text, rounds, stops = case
    result = run(rounds, stop=stops, close=True)
    expected = _expected(text, stops)
    assert result.joined == expected
    assert result.stream.text == expected
    assert result.stream.finish_reason == (STOP if any(s in text for s in stops) else LENGTH)
    assert "\ufffd" not in result.joined or "\ufffd" in text


# -- work: each character pushed is looked at a bounded number of times ---------------------------


class ReadStop(str):
    """A stop string that counts the characters read through it (the stream reads its stops only by their
    methods: slicing, indexing, startswith)."""

    read = 0

    def __getitem__(self, key: int | slice) -> str:
        part = super().__getitem__(key)
        ReadStop.read += len(part)
        return part

    def startswith(self, prefix: str | tuple[str, ...], *bounds: int | None) -> bool:
        ReadStop.read += sum(map(len, prefix)) if isinstance(prefix, tuple) else len(prefix)
        return super().startswith(prefix, *bounds)


LONG = 3000  # characters of the stop string below


@pytest.mark.parametrize("rounds", [
    pytest.param([[b"a" * (LONG - 1) + b"b"]], id="a long near-match in one token"),
    pytest.param([[b"a" * (LONG - 1)], [b"b"]] * 3, id="a long near-match held, then released, thrice"),
    pytest.param([[b"a"] * (LONG - 1) + [b"b"]], id="a long near-match token by token"),
])
def test_stop_strings_cost_what_the_text_is_long(rounds: list[list[bytes]]) -> None:
    ReadStop.read = 0
    stop = ReadStop("a" * LONG + "!")
    result = run(rounds, stop=[stop])
    pushed = sum(len(piece) for pieces in rounds for piece in pieces)
    assert result.joined == "".join(piece.decode() for pieces in rounds for piece in pieces)
    assert ReadStop.read <= 8 * (pushed + len(stop))  # linear: a quadratic rescan reads millions
