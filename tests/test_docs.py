"""The README and docs/ are a user's first hour: every link points inside the repository, every
file they name exists, and every `python -m tritonad ...` command they show parses (a
benchmark's own options by that benchmark)."""
import re
import shlex
from pathlib import Path

import pytest

from tritonad import cli

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_lines(text):
    """The lines of the ```bash blocks, without prompts and comments."""
    lines, block = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            block = line.strip("`").strip() if block is None else None
            continue
        if block in ("bash", "sh"):
            line = line.removeprefix("$ ").split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(doc):
    for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        assert path.exists(), f"{doc.name} links to a missing file: {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_named_files_exist(doc):
    named = set(re.findall(r"`((?:tritonad|benchmarks|scripts|examples|tests|docs|notes|data)"
                           r"/[\w./-]+?)`", doc.read_text()))
    named |= {w for line in code_lines(doc.read_text()) for w in shlex.split(line)
              if re.match(r"(benchmarks|scripts|examples)/\w+\.py$", w)}
    missing = sorted(n for n in named if not (ROOT / n.rstrip("/")).exists()
                     and not (ROOT / n).with_suffix("").exists())
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_readme_commands_parse(monkeypatch, capsys):
    """Every `python -m tritonad ...` line parses; options `bench` passes on to one benchmark
    are options of that benchmark (in its --help)."""
    commands = [shlex.split(line) for line in code_lines((ROOT / "README.md").read_text())
                if line.startswith("python -m tritonad ")]
    assert len(commands) >= 5
    parser = cli._parser()
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    for argv in commands:
        args, extra = parser.parse_known_args(argv[3:])
        if not extra:
            continue
        assert args.command == "bench" and args.which != "all", argv
        benchmark = __import__("bench_" + args.which.replace("-", "_"))
        with pytest.raises(SystemExit):
            benchmark.main(["-h"])
        usage = capsys.readouterr().out
        for option in extra:
            name = re.escape(option.split("=")[0])
            assert not option.startswith("-") or re.search(name + r"(?![\w-])", usage), \
                (argv, option)
