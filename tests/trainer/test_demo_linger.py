"""`make demo` keeps the service up after the run for its page, saying so, for as long as --linger says."""

from __future__ import annotations

import time

from trainer_client import demo


def test_the_demo_waits_for_its_page_as_long_as_asked(capsys):
    assert demo._parser().parse_args([]).linger == 60.0
    started = time.monotonic()
    demo.linger(0.2, "http://127.0.0.1:1/ui/run")
    assert time.monotonic() - started >= 0.2
    out = capsys.readouterr().out
    assert "stays up for 0.2 s" in out and "http://127.0.0.1:1/ui/run" in out and "--linger" in out


def test_no_wait_with_linger_zero(capsys):
    started = time.monotonic()
    demo.linger(0, "http://127.0.0.1:1/ui/run")
    assert time.monotonic() - started < 0.1 and capsys.readouterr().out == ""
