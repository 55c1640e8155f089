"""The README and docs/ hold together: every relative link resolves, the counts they state are the code's,
the run history stays in docs/log.md, and the commands they quote are the ones CI and the code run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LOG = ROOT / "docs" / "log.md"
METHOD = [p for p in PAGES if p != LOG]  # every page but the run history


def _prose(path: Path) -> str:
    """A page's text without its fenced code blocks (a link or a count in a code block is an example)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def _paragraphs(path: Path) -> list[str]:
    """A page's paragraphs, each on one line (a phrase may break across lines)."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", path.read_text())]


def _prose_paragraphs(path: Path) -> list[str]:
    """A page's paragraphs outside its fenced code blocks (a program's output quoted there counts its own
    lines: "106 configurations within 10%")."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", _prose(path))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, _ and - stay),
    blanks to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor on a page, a repeated heading's with GitHub's -1, -2 ... suffix."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose(path), flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    """The targets of a page's markdown links and images, outside code."""
    prose = re.sub(r"`[^`\n]*`", "", _prose(path))
    return re.findall(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)


def test_the_pages_exist_and_have_links():
    assert (ROOT / "README.md").exists() and LOG.exists()
    assert len(links(ROOT / "README.md")) >= 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_its_anchor(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... are not checked here
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_slugs_are_github_s():
    assert slug("Validation: `python -m studies.validation`") == "validation-python--m-studiesvalidation"
    assert slug("The machine's own steadiness") == "the-machines-own-steadiness"
    assert slug("Run 14") == "run-14"


# -- the run history lives in docs/log.md only ---------------------------------------------------------
# "run 14", "runs 24-28": a numbered run of the validation grid (not "run 3 times", a summary's phrase, nor
# "the run 8.3 s later", nor the option "--runs 5").
RUN_NUMBER = re.compile(r"(?<!-)\b[Rr]uns? \d+(?:[–-]\d+)?\b(?!\.\d| times)")
# a commit named in the text: seven hexadecimal digits with at least one letter and one digit
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7}\b")


@pytest.mark.parametrize("page", METHOD, ids=lambda p: str(p.relative_to(ROOT)))
def test_numbered_runs_are_narrated_only_in_the_log(page):
    text = _prose(page)
    assert not RUN_NUMBER.findall(text), f"{page.name} narrates numbered runs; they belong in docs/log.md"


@pytest.mark.parametrize("page", [p for p in METHOD if p.name != "README.md"], ids=lambda p: p.name)
def test_commits_are_named_only_in_the_log_and_the_readme_s_results(page):
    assert not COMMIT.findall(_prose(page)), f"{page.name} names a commit; the run history is docs/log.md's"


def test_the_readme_names_one_commit_the_one_its_table_was_measured_on():
    readme = _prose(ROOT / "README.md")
    commits = set(COMMIT.findall(readme))
    assert len(commits) == 1, commits
    assert commits <= set(COMMIT.findall(LOG.read_text()))  # and the log has that run


# -- counts the pages state, read from the code ------------------------------------------------------------
def _counts() -> dict[str, int]:
    from real.validation.config import STEPS
    from real.validation.losses import LOSS_STEPS
    from real.validation.prediction import LONG_RUN, MIN_STEPS, PREDICTION_SEEDS
    from studies import scaling, tradeoffs, validation

    return {
        "validation": len(validation.grid()),
        "validation_without_extra": len(validation.grid(extra=())),
        "quick": len(validation.quick_grid()),
        "extra": len(validation.grid()) - len(validation.grid(extra=())),
        "scaling": len(scaling.Study().runs()),
        "scaling_data_parallel": len(scaling.SCHEMES) * len(scaling.CLUSTERS) * len(scaling.WORKLOADS)
        * len(scaling.Study().gpus),
        "tradeoffs": len(tradeoffs.SCHEMES) * len(tradeoffs.RATES) * tradeoffs.SEEDS,
        "tradeoffs_seeds": tradeoffs.SEEDS,
        "quick_batch": validation.QUICK_BATCH,
        "steps": STEPS,
        "min_steps": MIN_STEPS,
        "long_run": LONG_RUN,
        "loss_steps": LOSS_STEPS,
        "steadiness": validation.STEADINESS,
        "quick_steadiness": validation.QUICK_STEADINESS,
        "seeds": PREDICTION_SEEDS,
    }


def _targets() -> str:
    """The validation's targets as real.md words them, from real.validation.verdict's bounds."""
    from real.validation.verdict import GRID_SECONDS, MISS, TARGETS

    step_median, step_max, speedup_median, speedup_max, staleness = (round(t.bound * 100) for t in TARGETS)
    return (f"step time median ≤ {step_median} % and max ≤ {step_max} %, speedup median ≤ {speedup_median} % "
            f"and max ≤ {speedup_max} %, every staleness mean within {staleness} %, no sign bias among the "
            f"step-time misses beyond {round(MISS * 100)} %, the grid within {round(GRID_SECONDS / 60)} minutes")


WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _number(text: str) -> int:
    return WORDS[text.lower()] if text.lower() in WORDS else int(text.replace(",", ""))


# (page, phrase with one number, which count it must be); each phrase must be found
STATED = [
    ("README.md", r"with and without a straggler — (\d[\d,]*) configurations", "validation"),
    ("docs/studies.md", r"emulated network \(root\), (\d[\d,]*) configurations", "validation"),
    ("docs/real.md", r"the default grid \((\d[\d,]*) configurations\)", "validation"),
    ("docs/real.md", r"--quick +# (\d+) configurations at batch", "quick"),
    ("docs/real.md", r"The default grid has (\w+) such rows", "extra"),
    ("docs/real.md", r"grid's (\d[\d,]*) other rows already take", "validation_without_extra"),
    ("docs/real.md", r"over the default grid's (\d[\d,]*) runs", "validation"),
    ("README.md", r"`--check` calibrates [^(]*\((\w+) configurations at batch", "quick"),
    ("docs/studies.md", r"studies\.scaling` \|[^|]*\| [^|]*?\((\d[\d,]*) configurations\)", "scaling"),
    ("docs/studies.md", r"studies\.scaling +# (\d[\d,]*) configurations", "scaling"),
    ("docs/studies.md", r"studies\.scaling +# [^\n]*? for the (\d[\d,]*) data-parallel ones", "scaling_data_parallel"),
    ("docs/studies.md", r"studies\.scaling` \|[^|]*\| [^|]*?for the (\d[\d,]*) data-parallel", "scaling_data_parallel"),
    ("docs/studies.md", r"below; (\d[\d,]*) runs in", "tradeoffs"),
    ("docs/studies.md", r"inner and Nesterov outer steps\) over (\w+) seeds", "tradeoffs_seeds"),
    ("README.md", r"\(\d+ configurations at batch (\d+)", "quick_batch"),
    ("docs/real.md", r"Every run has `--steps` steps \((\d+)\)", "steps"),
    ("docs/real.md", r"or fewer \(at least (\d+), a multiple of 4\)", "min_steps"),
    ("docs/real.md", r"when the simulation says it would take over (\d+) s", "long_run"),
    ("docs/real.md", r"`--loss-steps` steps \((\d+) by default", "loss_steps"),
    ("docs/real.md", r"`--steadiness` seconds, (\d+) by default", "steadiness"),
    ("docs/real.md", r"by default and (\d+) with `--quick`", "quick_steadiness"),
    ("docs/real.md", r"A prediction is (\w+) simulations", "seeds"),
]


@pytest.mark.parametrize("page,phrase,count", STATED, ids=[f"{p}:{c}" for p, _, c in STATED])
def test_a_count_the_docs_state_is_the_code_s(page, phrase, count):
    text = "\n".join(_paragraphs(ROOT / page))
    found = re.findall(phrase, text)
    assert found, f"{page} no longer says {phrase!r}: update this test with the page"
    expected = _counts()[count]
    assert {_number(f) for f in found} == {expected}, f"{page}: {phrase!r} says {found}, the code {expected}"


def test_the_targets_real_md_states_are_the_verdict_s():
    assert _targets() in " ".join(_paragraphs(ROOT / "docs" / "real.md"))


@pytest.mark.parametrize("page", METHOD, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_count_of_configurations_outside_the_log_is_one_the_code_gives(page):
    counts = _counts()
    allowed = {counts[k] for k in ("validation", "validation_without_extra", "quick", "scaling",
                                   "scaling_data_parallel")}
    stated = [_number(n) for n in re.findall(r"\b(\d[\d,]*|" + "|".join(WORDS) + r") configurations\b",
                                              " ".join(_prose_paragraphs(page)), flags=re.I)]
    assert set(stated) <= allowed, f"{page.name}: {sorted(set(stated) - allowed)} configurations is no grid's size"


def test_the_validation_s_quick_preset_takes_one_time_everywhere():
    """--check is the validation's --quick: every page that says how long it takes says the same."""
    said = set()
    for page in METHOD:
        for paragraph in _paragraphs(page):
            for line in paragraph.split(" # "):
                if re.search(r"--check\b|validation --quick|validation's quick preset", line):
                    said |= set(re.findall(r"about (a minute|[\d.]+ s\b|[\w-]+ minutes)", line))
    assert len(said) == 1, f"the quick preset's time is given as {sorted(said)}"


# -- the commands the pages quote --------------------------------------------------------------------------
def test_the_readme_s_test_command_is_the_one_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    command = ci[-1]
    assert "python -m pytest" in command
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^```bash\n" + re.escape(command) + r"\n```", readme, flags=re.M), \
        f"the README's test command is not .ci/run's {command!r}"


def test_every_scheme_the_grammar_page_names_parses():
    from syncsim.schemes import parse

    text = (ROOT / "docs" / "schemes.md").read_text()
    examples = re.search(r"^Examples: (.*?)\. What", text, flags=re.S | re.M).group(1)
    names = re.findall(r"`([^`]+)`", examples)
    assert len(names) >= 8
    for name in names:
        assert str(parse(name)) == str(parse(str(parse(name))))
    table = [row.split("|")[2].strip(" `") for row in text.splitlines() if row.startswith("| ") and "`" in row]
    for spec in filter(None, table):
        parse(spec)
