"""The shell and Python examples of the README and docs/ print what the pages say they print (the same seed,
the same figures); an example measured on the testbed prints lines the study prints."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _examples(pattern: str) -> list[tuple[str, str, str]]:
    """(page, command or code, output) for every example on every page that ``pattern`` finds."""
    return [(page.relative_to(ROOT).as_posix(), *found) for page in PAGES
            for found in re.findall(pattern, page.read_text(), flags=re.S)]


# a fenced block that starts with "$ syncsim ...": the command (backslash continuations joined), then its output
EXAMPLES = _examples(r"```\n\$ (syncsim (?:[^\n]*\\\n)*[^\n]*)\n(.*?)```")
# a Python block, then "This prints", then a plain block: the code and what it prints
PRINTS = _examples(r"```python\n(.*?)```\s*\nThis prints\s*\n\n```\n(.*?)```")


def test_the_readme_has_syncsim_examples():
    assert sum(page == "README.md" for page, _, _ in EXAMPLES) >= 3
    assert PRINTS  # docs/convergence.md's time to accuracy


@pytest.mark.parametrize("page,command,output", EXAMPLES, ids=[f"{p}:{c.split()[1]}" for p, c, _ in EXAMPLES])
def test_a_syncsim_example_prints_its_output(page, command, output):
    argv = shlex.split(command.replace("\\\n", " "))
    run = subprocess.run([sys.executable, "-m", "syncsim", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip() == output.rstrip(), f"{page}: `{command}` prints otherwise now"


@pytest.mark.parametrize("page,code,output", PRINTS, ids=[p for p, _, _ in PRINTS])
def test_a_python_example_prints_its_output(page, code, output, tmp_path):
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip() == output.rstrip(), f"{page}: its example prints otherwise now"


def test_the_readme_s_python_api_runs(tmp_path):
    """The API in ten lines runs as written (it writes its timeline where it runs)."""
    code = re.search(r"## The API in ten lines\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.splitlines()) == 4 and (tmp_path / "ssp.json").exists()


# -- the testbed's --check: measured on one machine, so its lines are checked for their form ----------------
def _form(line: str) -> str:
    """A printed line with its numbers (and a worst row's configuration) taken out: what any run of the same
    code prints in that place."""
    line = re.sub(r"worst: .*?: predicted", "worst: CONFIGURATION: predicted", line.rstrip())
    return re.sub(r"[-+]?\d[\d,.]*(?:e[-+]?\d+)?", "#", line)


def test_the_readme_s_testbed_check_prints_lines_the_validation_prints(tmp_path, monkeypatch):
    import pandas as pd

    from real.testbed.steadiness import Steadiness
    from real.validation.summary import summary_lines
    from studies import validation
    from tests.unit.fake_validation import fake_study

    block = re.search(r"```\n\$ sudo python -m real\.testbed --check\n(.*?)```", README, flags=re.S)
    assert block, "the README no longer shows the testbed's --check with its output"
    shown = block.group(1).splitlines()
    assert len(shown) >= 3
    # the quick preset's rows, on the simulator standing in for the testbed; then the summary as the study
    # prints it, after a steadiness timing of an unsteady machine (the README's run was on a busy one)
    fake_study(monkeypatch, fail=set())
    assert validation.main(["--quick", "--out", str(tmp_path), "--steps", "10", "--steadiness", "0"]) == 0
    frame = pd.read_csv(tmp_path / "validation.csv", keep_default_na=False, na_values=[""])
    unsteady = Steadiness("mlp", validation.QUICK_BATCH, 1.0, (1.5e-3, 2.4e-3) * 5)
    lines = summary_lines(frame, unsteady, default_keys={c.key for c in validation.grid()}, wall_seconds=98.0)
    printed = {_form(f"studies.validation: {line}") for line in lines}
    unmatched = [line for line in shown if _form(line) not in printed]
    assert not unmatched, "lines the validation no longer prints:\n" + "\n".join(unmatched)


def test_a_file_the_readme_shows_is_the_file_in_the_repository():
    """A block that starts with '# PATH' shows that file as it is, so its example runs on what it shows."""
    shown = re.findall(r"```\w*\n# ([\w./-]+)\n(.*?)```", README, flags=re.S)
    assert shown
    for path, text in shown:
        assert (ROOT / path).read_text() == text, f"the README shows {path} otherwise than it is"
