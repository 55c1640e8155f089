"""The paper's build: it reads results/ and refuses, naming the file, when a result it quotes is missing."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("paper_build", ROOT / "paper" / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)


def test_missing_results_are_named_with_the_command_that_writes_them(tmp_path, capsys):
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "published.csv").write_text("dataset\n")
    assert build.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "validation/validation.csv" in err and "python -m studies.validation" in err
    assert "published/published.csv" not in err  # present, so not reported
    assert not (tmp_path / "out" / "paper.pdf").exists()


def test_every_quoted_study_has_a_required_file():
    for name in build.STUDIES:
        assert any(path.startswith(name + "/") for path in build.REQUIRED), name
    for source in build.FIGURES.values():
        assert source in build.REQUIRED


def test_the_text_quotes_only_numbers_the_build_writes():
    # every #n.<study>.<key> in paper.typ is produced by that study's function (checked by name)
    import re
    text = (ROOT / "paper" / "paper.typ").read_text()
    quoted = set(re.findall(r"#\(?n\.([a-z]+)\.([a-z_0-9]+)", text))
    sources = {name: (ROOT / "paper" / "build.py").read_text() for name in build.STUDIES}
    for study, key in quoted:
        assert study in build.STUDIES, study
        assert f'"{key}"' in sources[study], f"{study}.{key} is quoted but never written"


def test_no_quoted_number_swallows_a_semicolon():
    # Typst ends an embedded expression at a semicolon and drops it: "#n.a.b;" and "#(n.a.b);" alike
    # print the number without its ";" (checked by compiling both) — escape it: "#n.a.b\\;"
    import re
    text = (ROOT / "paper" / "paper.typ").read_text()
    plain = r"#n\.[a-z_0-9.]+(?:\([0-9]+\)[a-z_0-9.]*)*;"  # #n.a.b; and #n.a.at(0).b;
    wrapped = r"#\(n\.[^()]*(?:\([0-9]+\)[^()]*)*\);"  # #(n.a.b);
    assert re.findall(plain, text) == [] and re.findall(wrapped, text) == []


@pytest.mark.parametrize("value, text", [(0.0381, "3.8\u00a0%"), (float("nan"), "n/a")])
def test_percentages_do_not_break_before_the_sign(value, text):
    assert build.pct(value) == text
