"""Whatever the CLI prints from user data (queue names, references, payload previews, error messages)
reaches the terminal as text: control characters are written as escapes, never sent raw."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

import pytest

from querator.cli.output import ExitCode, print_json, shown, table
from querator.client import NewItem

if TYPE_CHECKING:
    from collections.abc import Callable

    from querator.client import Client
    from tests.cli.conftest import Result

    Run = Callable[..., Result]

#: A terminal acts on each of these: NUL, BEL, ESC (here clearing the screen), DEL, C1's CSI, a
#: line separator and a right-to-left override.
HOSTILE = "a\x00b\x07c\x1b[2Jd\x7fe\x9bf\u2028g\u202eh"
ESCAPED = "a\\x00b\\x07c\\x1b[2Jd\\x7fe\\x9bf\\u2028g\\u202eh"


def _raw_controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (a newline between lines is ours)."""
    return [c for c in text.replace("\n", "") if not c.isprintable()]


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("\x00", "\\x00"),
        ("\x07", "\\x07"),
        ("\x1b", "\\x1b"),
        ("\x7f", "\\x7f"),
        ("\x85", "\\x85"),
        ("\x9b", "\\x9b"),
        ("\t", "\\x09"),
        ("\n", "\\x0a"),
        ("\u2028", "\\u2028"),
        ("\u202e", "\\u202e"),
        ("\u2066", "\\u2066"),
    ],
)
def test_shown_escapes_what_a_terminal_would_act_on(raw: str, escaped: str) -> None:
    assert shown(f"q{raw}q") == f"q{escaped}q"


def test_shown_keeps_printable_text_of_any_script_and_emoji() -> None:
    for text in ("orders", "訂單 été", "👩\u200d💻"):  # the zero-width joiner is how emoji combine
        assert shown(text) == text


def test_a_table_escapes_its_cells() -> None:
    printed = table(["NAME", "REFERENCE"], [[HOSTILE, "ok"]])
    assert ESCAPED in printed
    assert _raw_controls(printed) == []


def test_json_output_escapes_what_json_dumps_leaves_raw_and_means_the_same() -> None:
    # json.dumps escapes C0 controls but writes DEL, C1, U+2028 and bidi overrides as they are.
    out = io.StringIO()
    print_json({"queue_name": HOSTILE}, out)
    assert _raw_controls(out.getvalue()) == []
    assert json.loads(out.getvalue()) == {"queue_name": HOSTILE}


def test_peek_shows_a_hostile_reference_and_payload_as_escapes(
    run: Run, client: Client, queue_name: str
) -> None:
    run("queues", "create", queue_name)
    client.produce(queue_name, [NewItem(payload="\x1b]0;title\x07", reference=HOSTILE)])

    result = run("peek", queue_name)

    assert result.code == ExitCode.OK, result.err
    assert ESCAPED in result.out
    assert "\\x1b]0;title\\x07" in result.out
    assert _raw_controls(result.out) == []


def test_an_error_naming_a_hostile_queue_name_is_escaped(run: Run) -> None:
    result = run("stats", "no\x1b[2Jq")

    assert result.code == ExitCode.BAD_REQUEST
    assert "Queue does not exist" in result.err
    assert "no\\x1b[2Jq" in result.err
    assert _raw_controls(result.err) == []


def test_creating_a_queue_with_a_control_character_is_refused(run: Run) -> None:
    result = run("queues", "create", "esc\x1bq")

    assert result.code == ExitCode.BAD_REQUEST
    assert "queue_name may not hold control characters" in result.err
    assert _raw_controls(result.err) == []
