"""The results pages say what their data say: every figure in docs/results.md and in the README's
results section is rendered from profiling/results/*.json by profiling/render_results.py.

These tests fail when a figure was edited by hand, when a figure stands outside the generated
blocks, when a table would mix CPU models, and check the rules that make a figure stale."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "profiling"))

import _provenance as provenance  # noqa: E402
import _test_times as test_times  # noqa: E402
import render_results as render  # noqa: E402

README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results.md"


def test_the_pages_equal_what_their_summaries_render(capsys: pytest.CaptureFixture[str]) -> None:
    status = render.main(["--check"])
    assert status == 0, capsys.readouterr().err


def test_every_block_on_the_pages_has_a_renderer_and_every_renderer_a_block() -> None:
    names = [m.group("name") for page in (README, RESULTS_PAGE) for m in render.BLOCK.finditer(page.read_text())]
    assert sorted(names) == sorted(render.BLOCKS), "each block once, and no renderer without its block"


def test_a_figure_edited_by_hand_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "README.md"
    text = README.read_text(encoding="utf-8")
    block = next(m for m in render.BLOCK.finditer(text) if m.group("name") == "readme-results")
    body = block.group("body")
    figure = next(m for m in render.FIGURE.finditer(body) if "x" in m.group(0))
    edited = body[: figure.start()] + "9.999x" + body[figure.end() :]
    page.write_text(text.replace(body, edited), encoding="utf-8")
    assert render.main(["--check", str(page)]) == 1
    assert "block 'readme-results' differs" in capsys.readouterr().err
    # and rendering it again restores the data's figure
    assert render.main([str(page)]) == 0
    assert page.read_text(encoding="utf-8") == text


def test_no_figure_stands_outside_the_generated_blocks() -> None:
    assert render.figures_outside_blocks(RESULTS_PAGE.read_text(encoding="utf-8")) == []
    readme_results = render.readme_results_section(README.read_text(encoding="utf-8"))
    assert "<!-- results:readme-results -->" in readme_results
    assert render.figures_outside_blocks(readme_results) == []


@pytest.mark.parametrize("typed", ["1.25x faster", "within 5 % of gloo", "took 12 ms", "in 3.5 s", "+8.1 %"])
def test_the_figure_scan_finds_a_typed_figure(typed: str) -> None:
    page = f"# Results\n\nText.\n<!-- results:acceptance -->\n| 1.5x |\n<!-- /results:acceptance -->\nIt is {typed}.\n"
    found = render.figures_outside_blocks(page)
    assert len(found) == 1 and found[0].startswith("line 7:"), found


def test_the_figure_scan_leaves_settings_commands_and_links_alone() -> None:
    page = "8 ranks at 1 Gbit/s, 32 MiB, l = 8/7, `--alpha 3us`, [x](a.md#b-1-5x), p = 1024, n+log2(n)-2\n"
    assert render.figures_outside_blocks(page) == []


def test_an_unknown_block_is_an_error() -> None:
    with pytest.raises(KeyError, match="no renderer for the block 'nonsense'"):
        render.render_page("<!-- results:nonsense -->\n<!-- /results:nonsense -->\n")


def test_the_readme_results_table_is_a_front_page() -> None:
    rows = [line for line in render.readme_results().splitlines() if line.startswith("| [")]
    assert 1 <= len(rows) <= 12
    assert all("docs/results.md#" in row for row in rows)
    headings = {
        "#" + "-".join(
            "".join(c for c in line[3:].lower() if c.isalnum() or c in " -").split()
        )
        for line in RESULTS_PAGE.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }
    for row in rows:
        anchor = row.split("docs/results.md", 1)[1].split(")", 1)[0]
        assert anchor in headings, f"{anchor} is no heading of docs/results.md"


def test_every_table_names_its_cpu_model_and_each_row_its_commit() -> None:
    text = RESULTS_PAGE.read_text(encoding="utf-8")
    for match in render.BLOCK.finditer(text):
        body = match.group("body")
        if "|" not in body:
            continue
        assert "*Machine: " in body, f"block {match.group('name')} names no machine"
        shared = "Every row: `" in body or "Every table: `" in body
        rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
        if not shared:
            for row in rows[1:]:
                assert row.count("`") >= 2, f"a row of {match.group('name')} names no commit: {row}"


# --- the rules behind a stamp -----------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.invalid")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "measured.py").write_text("x = 1\n")
    (tmp_path / "other.py").write_text("y = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def _stamp(commit: str | None, cpu: str | None = "Intel(R) Xeon(R) Processor") -> provenance.Stamp:
    return provenance.Stamp(
        commit=commit, modified=False, date="2026-11-29T00:00:00+00:00", cpu_model=cpu, cores=2,
        kernel="6.1", load=1.0, command="bench", measured_paths=("measured.py",),
    )


def test_a_figure_is_fresh_until_its_measured_code_changes(repo: Path) -> None:
    commit = _git(repo, "rev-parse", "HEAD")
    assert provenance.staleness(_stamp(commit), repo) is None
    (repo / "other.py").write_text("y = 2\n")  # code it does not measure
    assert provenance.staleness(_stamp(commit), repo) is None
    (repo / "measured.py").write_text("x = 2\n")  # uncommitted: already stale
    provenance._changed_paths.cache_clear()
    assert provenance.staleness(_stamp(commit), repo) == f"stale since `{commit[:7]}`"
    _git(repo, "commit", "-qam", "two")
    provenance._changed_paths.cache_clear()
    assert provenance.staleness(_stamp(commit), repo) == f"stale since `{commit[:7]}`"
    assert provenance.staleness(_stamp(_git(repo, "rev-parse", "HEAD")), repo) is None


def test_a_figure_without_cpu_model_or_known_commit_is_stale(repo: Path) -> None:
    commit = _git(repo, "rev-parse", "HEAD")
    assert "recorded no CPU model" in str(provenance.staleness(_stamp(commit, cpu=None), repo))
    assert "not in this history" in str(provenance.staleness(_stamp("0" * 40), repo))


def test_a_table_refuses_two_cpu_models() -> None:
    xeon, epyc = _stamp("a" * 40), _stamp("b" * 40, cpu="AMD EPYC")
    assert provenance.one_machine([xeon, _stamp("c" * 40)], "t") == xeon
    with pytest.raises(provenance.MixedMachines, match="table 't' mixes CPU models"):
        provenance.one_machine([xeon, epyc], "t")
    with pytest.raises(provenance.MixedMachines):
        render.table("t", ["a"], [render.Row(["1"], xeon), render.Row(["2"], epyc)])


def test_the_cpu_model_is_never_the_bare_architecture() -> None:
    assert provenance.cpu_model_of({"processor": "x86_64"}) is None
    assert provenance.cpu_model_of({"processor": "AMD EPYC"}) == "AMD EPYC"
    assert provenance.cpu_model_of({"processor": "x86_64", "cpu_model": "Intel(R) Xeon(R) Processor"}) == (
        "Intel(R) Xeon(R) Processor"
    )
    assert _stamp(None).cpu == "Intel Xeon"


def test_a_part_measured_by_another_launch_has_its_own_machine() -> None:
    record = {"benchmark": "scale", "machine": {"cpu_model": "AMD EPYC"}, "source": {"commit": "a" * 40}, "date": "d"}
    assert provenance.stamp_of(record).cpu_model == "AMD EPYC"
    assert provenance.stamp_of(record, {"commit": "b" * 40, "date": "e"}).cpu_model is None
    part = provenance.stamp_of(record, {"commit": "b" * 40, "date": "e", "machine": {"cpu_model": "Intel Xeon"}})
    assert (part.cpu_model, part.commit) == ("Intel Xeon", "b" * 40)
    assert part.measured_paths == provenance.MEASURED_PATHS["scale"]


def test_noise_is_neither_met_nor_missed() -> None:
    # within the A/A spread of the target: the run cannot tell
    assert render.verdict(False, noise=0.05, measured=0.97, threshold=0.98).startswith("noise")
    assert render.verdict(True, noise=0.05, measured=1.02, threshold=0.98).startswith("noise")
    # a miss by more than the spread is a miss, a meet by more is a meet
    assert render.verdict(False, noise=0.075, measured=0.989, threshold=1.1) == "**no**"
    assert render.verdict(False, noise=0.01, measured=0.96, threshold=0.98) == "**no**"
    assert render.verdict(True, noise=0.01, measured=1.2, threshold=1.1) == "yes"
    assert render.verdict(True) == "yes"


def test_a_training_row_is_noise_where_its_aa_control_spreads_wider_than_it_can_tell() -> None:
    """No fault: met or missed only with every run's A/A control within 1 % of parity. A fault
    row: noise only where the control's spread reaches the figure's distance from its target."""
    row = {"scenario": "no_fault", "met": True, "speedup_steady": 0.995, "lowest": 0.99}
    assert render._train_verdict({**row, "control_spread": 0.004}) == "yes"
    assert render._train_verdict({**row, "control_spread": 0.02}).startswith("noise")
    assert render._train_verdict({**row, "control_spread": None}) == "yes"  # a summary made without a control
    missed = {**row, "met": False, "speedup_steady": 0.97, "control_spread": 0.005}
    assert render._train_verdict(missed) == "**no**"
    fault = {"scenario": "straggler", "met": True, "speedup_steady": 1.12, "lowest": 1.1}
    assert render._train_verdict({**fault, "control_spread": 0.03}).startswith("noise")
    assert render._train_verdict({**fault, "control_spread": 0.01}) == "yes"


def test_every_summary_records_what_a_table_needs() -> None:
    for path in sorted((ROOT / "profiling" / "results").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        for key in ("benchmark", "command", "source", "machine", "date", "measured_paths"):
            assert key in record, f"{path.name} lacks {key}"
        assert record["benchmark"] in provenance.MEASURED_PATHS, path.name
        for measured in record["measured_paths"]:
            assert (ROOT / measured).exists(), f"{path.name} measures {measured}, which does not exist"


def test_the_test_times_summary_groups_test_files(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_sim_fast" name="a" time="1.5"/>'
        '<testcase classname="tests.test_sim_graph" name="b" time="2.0"><skipped/></testcase>'
        '<testcase classname="tests.test_horovod_peers" name="c" time="4.0"><failure/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    summary = test_times.summarise(junit)
    assert summary["tests"] == 3
    assert summary["outcomes"] == {"passed": 1, "skipped": 1, "failed": 1}
    assert summary["groups"] == [
        {"group": "horovod", "tests": 1, "seconds": 4.0},
        {"group": "sim", "tests": 2, "seconds": 3.5},
    ]
