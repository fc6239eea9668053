"""README.md's excerpt of the main job is what the main job prints.

The suite runs no other `zoo run recipes/alexnet.yaml` through the command line, so the slow test
here is the main job end to end, as the README tells a newcomer to run it (a fresh cache and zoo,
piped output), then again (all cached) and a pull; scripts/readme_excerpt.py normalises what
varies between machines and runs, and every other line must be the README's."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import readme_excerpt  # noqa: E402

BLOCK = readme_excerpt.readme_block()


def _run_like_the_readme(**figures: str) -> str:
    """The README's block with machine-specific values filled in, as a run on another machine prints it."""
    text = BLOCK
    for placeholder, value in figures.items():
        text = text.replace(placeholder, value, 1)
    return text


def test_the_readme_block_is_normalised_and_shows_the_main_job():
    lines = readme_excerpt.normalise(BLOCK)
    assert [line.rstrip() for line in BLOCK.splitlines()] == lines
    assert lines[0] == "$ zoo run recipes/alexnet.yaml" and "published alexnet@1.0.0" in lines
    assert any(line.startswith("alexnet@1.0.0: 7 ran, 0 cached") for line in lines)
    assert lines[-1].endswith("/builds/cpu-int8/model.onnx")


def test_what_varies_between_machines_is_not_a_difference():
    other = BLOCK
    for old, new in (("done in …s", "done in 12.34s"), ("(…s of stage time)", "(99.9s of stage time)"),
                     ("starting with … thread(s)", "starting with 16 thread(s)"), ("running (…)", "running (new)")):
        other = other.replace(old, new)
    other = other.replace("train_loss …", "train_loss 0.123")
    other += "[zoo] train: running for 1:10 · epoch 1/4 · train_loss 2.2\n"  # a slow machine's extra line
    # a CPU class the lockfile has no records for: the first run adds them
    other = other.replace("published alexnet@1.0.0\n", "published alexnet@1.0.0\nupdated alexnet.lock\n", 1)
    assert readme_excerpt.differences(BLOCK, other) == []


def test_a_line_the_run_does_not_print_is_a_difference():
    other = BLOCK.replace("published alexnet@1.0.0\n", "", 1)
    problems = readme_excerpt.differences(BLOCK, other)
    assert any("published alexnet@1.0.0" in p for p in problems), problems
    renamed = BLOCK.replace("train_loss …", "training_loss …")
    assert readme_excerpt.differences(BLOCK, renamed)


@pytest.mark.slow
def test_the_main_job_prints_what_the_readme_shows(tmp_path):
    run = readme_excerpt.transcript(tmp_path)
    assert readme_excerpt.differences(BLOCK, run) == [], run
