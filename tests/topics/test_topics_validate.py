"""validate_topic / validate_filter: MQTT rules, the extended syntax, and error positions."""

from __future__ import annotations

import pytest

from topics import MAX_TOPIC_BYTES, InvalidTopic, validate_filter, validate_topic


@pytest.mark.parametrize("name", ["a", "a/b", "/", "a//b", "$SYS/x", "é/ü", "a b/c", "x" * MAX_TOPIC_BYTES])
def test_valid_topic_names(name: str) -> None:
    validate_topic(name)


@pytest.mark.parametrize(
    ("name", "fragment", "position"),
    [
        ("", "empty", 0),
        ("a/+", "wildcard '+' at position 2", 2),
        ("a/b#", "wildcard '#' at position 3", 3),
        ("ab\x00c", "U+0000 at position 2", 2),
        ("a\ud800", "lone surrogate at position 1", 1),
    ],
)
def test_invalid_topic_names(name: str, fragment: str, position: int) -> None:
    with pytest.raises(InvalidTopic) as info:
        validate_topic(name)
    assert fragment in str(info.value)
    assert info.value.position == position
    assert isinstance(info.value, ValueError)


def test_length_is_counted_in_utf8_bytes() -> None:
    validate_topic("é" * (MAX_TOPIC_BYTES // 2))
    with pytest.raises(InvalidTopic, match="bytes long"):
        validate_topic("é" * (MAX_TOPIC_BYTES // 2 + 1))
    with pytest.raises(InvalidTopic, match="bytes long"):
        validate_filter("x" * (MAX_TOPIC_BYTES + 1))


def test_non_str_is_rejected() -> None:
    with pytest.raises(InvalidTopic, match="must be str"):
        validate_topic(b"a")  # type: ignore[arg-type]


@pytest.mark.parametrize("f", ["#", "+", "a/#", "+/+", "a/+/b", "/+", "+/", "$SYS/#", "a//#"])
def test_valid_filters(f: str) -> None:
    validate_filter(f)
    validate_filter(f, extended=True)


@pytest.mark.parametrize(
    ("f", "fragment", "position"),
    [
        ("a/#/b", "'#' must be the last level (position 2)", 2),
        ("#/a", "'#' must be the last level (position 0)", 0),
        ("a/b+", "'+' must occupy a whole level (position 3)", 3),
        ("a/#b", "'#' must occupy a whole level (position 2)", 2),
        ("+a/b", "'+' must occupy a whole level (position 0)", 0),
        ("a\x00/#", "U+0000 at position 1", 1),
        ("", "empty", 0),
    ],
)
def test_invalid_filters(f: str, fragment: str, position: int) -> None:
    with pytest.raises(InvalidTopic) as info:
        validate_filter(f)
    assert fragment in str(info.value)
    assert info.value.position == position


@pytest.mark.parametrize("f", ["#/a", "a/#/b", "#/#", "+/#/+/#"])
def test_extended_allows_hash_anywhere(f: str) -> None:
    validate_filter(f, extended=True)
    with pytest.raises(InvalidTopic, match="last level"):
        validate_filter(f)


def test_extended_still_needs_whole_levels() -> None:
    with pytest.raises(InvalidTopic, match=r"whole level \(position 3\)"):
        validate_filter("#/a#", extended=True)
