"""The documentation's shape (issue 41 item 5): a user's guide apart from the lab notes.

* the user's guide (every page under ``docs/`` but ``docs/lab/``) holds no run log: no
  "Session N" and no "run N" (the measurement histories live in ``docs/lab/``, linked from the
  page they came from);
* every relative link of every Markdown file of the repository resolves to a file inside the
  repository (no link to a document beside it that a clone does not have);
* ``docs/README.md`` (the table of contents) links every user page, and no user page is an
  orphan;
* README.md's headline figures are the performance summary's (docs/performance.md, "Summary
  against the issues' targets"): one source for every number.

Reads files only: a few milliseconds.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LAB = DOCS / "lab"

#: ``[text](target)`` and ``![alt](target)``, not inside inline code.
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_files() -> list[Path]:
    """Every Markdown file git tracks or would track (untracked, not ignored), O(files)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({ROOT / line for line in out.splitlines() if (ROOT / line).is_file()})


def user_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if LAB not in p.parents)


def without_code(text: str) -> str:
    """``text`` without fenced blocks and inline code spans (links there are examples)."""
    text = re.sub(r"^([ \t]*)```.*?^\1```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_the_users_guide_holds_no_run_logs() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in user_pages()
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if re.search(r"Session [0-9]+|run [0-9]+", line)
    ]
    assert not found, "run logs belong in docs/lab/:\n" + "\n".join(found)


def test_the_lab_notes_exist_and_are_linked_from_the_guide() -> None:
    lab = sorted(LAB.glob("*.md"))
    assert lab, "docs/lab/ holds the measurement histories"
    linked = {
        (page.parent / target.split("#")[0]).resolve()
        for page in user_pages()
        for target in LINK.findall(without_code(page.read_text()))
    }
    assert [p.name for p in lab if p.resolve() not in linked] == []


def test_every_relative_link_resolves_inside_the_repository() -> None:
    broken = []
    for md in markdown_files():
        for target in LINK.findall(without_code(md.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a web address or an anchor of the same page
            path = (md.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


def anchors(md: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces
    as hyphens, a repeated one numbered (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found = set()
    text = re.sub(r"^([ \t]*)```.*?^\1```", "", md.read_text(), flags=re.S | re.M)  # not headings
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_every_anchor_of_a_link_exists() -> None:
    """``page.md#heading`` links name a heading that page has (a section moved to docs/lab/
    takes its anchor with it)."""
    broken = []
    for md in markdown_files():
        for target in LINK.findall(without_code(md.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or "#" not in target:
                continue
            path, anchor = target.split("#", 1)
            page = (md.parent / path).resolve() if path else md
            if page.suffix == ".md" and page.exists() and anchor not in anchors(page):
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


def test_no_file_names_the_outside_contract() -> None:
    word = "CONT" + "RACT"  # spelt apart, so that this file does not name it either
    outside = "/work/" + "shared"  # the directory beside the repository that held it and the seeds
    run = subprocess.run(
        ["git", "grep", "--untracked", "-n", "-I", "-e", word, "-e", outside, "-e", "../" + "shared/"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.stdout == ""
    assert run.returncode == 1, run.stderr  # git grep's "nothing found" (not an error of git's)


def test_the_table_of_contents_links_every_lab_page() -> None:
    toc = DOCS / "README.md"
    linked = {(toc.parent / t.split("#")[0]).resolve() for t in LINK.findall(without_code(toc.read_text()))}
    assert [p.name for p in sorted(LAB.glob("*.md")) if p.resolve() not in linked] == []


def test_the_table_of_contents_links_every_user_page() -> None:
    toc = DOCS / "README.md"
    linked = {(toc.parent / t.split("#")[0]).resolve() for t in LINK.findall(without_code(toc.read_text()))}
    assert [str(p.relative_to(DOCS)) for p in user_pages() if p != toc and p.resolve() not in linked] == []


def summary() -> str:
    text = (DOCS / "performance.md").read_text()
    start = text.index("## Summary against the issues' targets")
    return text[start : text.index("\n## ", start + 1)]


#: A figure: a number with its unit (``819,843 msg/s``, ``6.5x``, ``1.82 ms``, ``215 B``).
FIGURE = re.compile(r"\d[\d,.]*(?:-\d[\d,.]*)?(?:x| ?%| ms| µs| B| MB| msg/s)(?![\w/])")


def test_readme_headline_figures_come_from_the_performance_summary() -> None:
    readme = (ROOT / "README.md").read_text()
    status = readme[readme.index("## Status") :]
    figures = FIGURE.findall(without_code(status))
    assert len(figures) >= 8, figures
    text = summary()
    assert [f for f in figures if f not in text] == []


def links_of(page: Path) -> set[Path]:
    return {
        (page.parent / t.split("#")[0]).resolve()
        for t in LINK.findall(without_code(page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", t)
    }


def test_the_newcomers_path_is_linked() -> None:
    """README -> getting started -> embedding -> Spark: each page links the next (each one's
    examples run in tests/test_readme.py, tests/test_docs_examples.py and
    tests/bridge/test_docs_spark.py)."""
    path = [ROOT / "README.md", DOCS / "getting-started.md", DOCS / "embedding.md", DOCS / "bridge.md"]
    for page, following in itertools.pairwise(path):
        assert following.resolve() in links_of(page), f"{page.name} should link {following.name}"
    assert (DOCS / "README.md").resolve() in links_of(ROOT / "README.md")


def test_the_compiled_module_count_shown_is_the_builds() -> None:
    """docs/operations.md shows ``siftmq version`` and the start-up log line with the number of
    hot-path modules; it must be ``broker._build.HOT_MODULES``'s (it said 18, then 24)."""
    from broker._build import HOT_MODULES

    shown = re.findall(r"hot path: (\d+) of (\d+) modules", (DOCS / "operations.md").read_text())
    assert shown
    assert {int(total) for _, total in shown} == {len(HOT_MODULES)}, (
        f"docs/operations.md: write 'hot path: {len(HOT_MODULES)} of {len(HOT_MODULES)} modules'"
    )


def test_the_reference_lists_every_command_and_ctl_verb() -> None:
    """docs/reference.md's command table names every ``siftmq`` sub-command the CLI has
    (plugins' included), and no other; a ``siftmq serve`` flag it names exists."""
    import argparse

    from broker._cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    reference = (DOCS / "reference.md").read_text()
    table = reference[reference.index("## Commands") : reference.index("## Configuration keys")]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `siftmq")]
    named = {name for cell in first_cells for name in re.findall(r"`siftmq (\w+)", cell)}
    assert named == set(commands.choices)
    serve_flags = {o for a in commands.choices["serve"]._actions for o in a.option_strings}
    flags = set(re.findall(r"`siftmq serve[^`]*?(--[\w-]+)", reference))
    flags |= set(re.findall(r"\(`(--[\w-]+)`\)", reference))
    assert flags and flags <= serve_flags, flags - serve_flags


def test_the_ctl_verbs_the_reference_lists_exist() -> None:
    import argparse

    from broker._cli import build_parser

    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(found[0].choices) if found else {}

    ctl = subcommands(build_parser())["ctl"]
    row = next(line for line in (DOCS / "reference.md").read_text().splitlines() if "`siftmq ctl " in line)
    nouns = subcommands(ctl)
    pairs = [(n, v) for n, v in re.findall(r"`(\w+) (\w+)[^`]*`", row) if n != "siftmq"]
    assert len(pairs) >= 10, pairs
    for noun, verb in pairs:
        assert noun in nouns and verb in subcommands(nouns[noun]), f"siftmq ctl {noun} {verb}"


def test_every_docs_path_named_in_the_repository_exists() -> None:
    """A ``docs/...`` path named in plain text (a docstring, a benchmark's output note, a page)
    names a file that exists: a page or plot moved to docs/lab/ is named there."""
    out = subprocess.run(
        ["git", "grep", "--untracked", "-ohE", r"docs/[A-Za-z0-9_./-]+\.(md|png|json)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    named = set(out.split())
    assert len(named) > 20
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
