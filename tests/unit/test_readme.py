"""The README's shell examples print what the README says they print (the same seed, the same figures)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# a fenced block that starts with "$ syncsim ...": the command (backslash continuations joined), then its output
EXAMPLES = re.findall(r"```\n\$ (syncsim (?:[^\n]*\\\n)*[^\n]*)\n(.*?)```", README, flags=re.S)


def test_the_readme_has_syncsim_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("command,output", EXAMPLES, ids=[c.split()[1] for c, _ in EXAMPLES])
def test_a_readme_example_prints_its_output(command, output):
    argv = shlex.split(command.replace("\\\n", " "))
    run = subprocess.run([sys.executable, "-m", "syncsim", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip() == output.rstrip()
